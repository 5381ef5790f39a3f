"""Calling actors the same way whether they are Ray actors or plain objects (tests, GPU boxes).

`EngineClient` is the sampling client the rollout talks to: it splits a turn's requests across
the engines, calls them in parallel and puts the results back in order.
"""
from __future__ import annotations

from typing import Any


def is_remote(handle) -> bool:
    return hasattr(handle, "_actor_id")


def call(handle, method: str, *args, **kwargs) -> Any:
    if is_remote(handle):
        import ray
        return ray.get(getattr(handle, method).remote(*args, **kwargs))
    return getattr(handle, method)(*args, **kwargs)


def call_all(handles, method: str, args_list=None, **kwargs) -> list:
    """The same method on many actors (in parallel when remote); args_list gives per-actor args.

    Fails fast: the first actor error is raised at once, without waiting for ranks that may be
    stuck in a collective with the one that died."""
    args_list = args_list or [() for _ in handles]
    if handles and is_remote(handles[0]):
        import ray
        refs = [getattr(h, method).remote(*a, **kwargs) for h, a in zip(handles, args_list)]
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            ray.get(ready)  # raises the actor's error, if any
        return ray.get(refs)
    return [getattr(h, method)(*a, **kwargs) for h, a in zip(handles, args_list)]


class Sync:
    """`Sync(handle).method(...)` blocks for the result, for remote and local handles alike."""

    def __init__(self, handle):
        self._handle = handle

    def __getattr__(self, method):
        return lambda *a, **k: call(self._handle, method, *a, **k)


class EngineClient:
    def __init__(self, engines: list):
        if not engines:
            raise ValueError("EngineClient needs at least one engine")
        self.engines = engines

    def generate(self, requests, sampling, expect_version=None):
        from dataclasses import replace
        n = len(self.engines)
        size = -(-len(requests) // n)
        chunks = [requests[i * size:(i + 1) * size] for i in range(n)]
        busy = [(e, c, i) for i, (e, c) in enumerate(zip(self.engines, chunks)) if c]
        # each engine gets its own seed so two engines never draw the same random stream
        args = [(c, replace(sampling, seed=None if sampling.seed is None else sampling.seed * 1009 + i), expect_version)
                for _, c, i in busy]
        results = call_all([e for e, _, _ in busy], "generate", args)
        return [r for chunk in results for r in chunk]

    def load_adapter(self, ref: dict) -> list[int]:
        return call_all(self.engines, "load_adapter", [(ref,)] * len(self.engines))

    def sleep(self):
        call_all(self.engines, "sleep")

    def wake_up(self):
        call_all(self.engines, "wake_up")

    def status(self) -> list[dict]:
        return call_all(self.engines, "status")
