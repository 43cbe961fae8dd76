# Two commands on a fresh machine: `make demo` and `make test`. Both (re)build the virtualenv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test bench eval lint clean

$(STAMP): pyproject.toml setup.py $(wildcard protos/*/*/*.proto)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

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
