# `make run` and `make test` each do their own set-up on a fresh machine: a virtualenv in .venv,
# torch 2.13.0 (CPU build) first so nothing pulls a multi-GB CUDA build, then visrl and its extras.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.visrl-installed

.PHONY: run test setup clean
run: $(STAMP)
	$(PY) driver.py $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

setup: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

clean:
	rm -rf runs .pytest_cache
