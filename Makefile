# Two commands on a fresh machine: `make demo` and `make test`. Both (re)build the virtualenv
# and install the system packages the tests run for real (Debian's, with apt-get).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SYSTEM_PACKAGES := redis-server chromium chromium-driver prometheus wrk
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install system demo test bench eval lint clean

$(STAMP): pyproject.toml setup.py $(wildcard protos/*/*/*.proto)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@# xds-protos ships an older copy of opentelemetry/proto/*: whichever wheel pip unpacks last
	@# wins, so the OTLP exporter's own protos are laid down again, over xds-protos' copy.
	$(PY) -m pip install --quiet --force-reinstall --no-deps \
		"opentelemetry-proto==$$($(PY) -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"
	touch $(STAMP)

system:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing $$missing"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			$(SUDO) apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

install: $(STAMP) system

demo: install
	$(VENV)/bin/saar demo

test: install
	$(PY) -m pytest

bench: install
	$(VENV)/bin/saar bench overhead

lint: install
	$(VENV)/bin/ruff check extproc tests
	$(VENV)/bin/mypy extproc

clean:
	rm -rf $(VENV) build *.egg-info extproc/_proto/*_pb2*.py extproc/_proto/*_pb2*.pyi
