"""tests/on_vllm/ run on vLLM's CPU build, in .venv-vllm (`make test-vllm`; `make test` runs them too).

In another environment, without vLLM, the folder is left out of collection, unless
VISRL_VLLM_TESTS=required (set by the Makefile), where a broken vLLM install must fail loudly.
"""
import importlib.util
import os

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("VISRL_VLLM_TESTS") == "required":
        raise ImportError("tests/on_vllm need vLLM's CPU build: run `make vllm-setup` (it installs .venv-vllm)")
    collect_ignore_glob = ["test_*.py"]
