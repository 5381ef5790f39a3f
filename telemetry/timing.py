"""Step latency by phase: `with phases("generate"): ...` adds to timing/<phase>."""
from __future__ import annotations

import time
from contextlib import contextmanager


class Phases:
    def __init__(self, on_enter=None):
        self.seconds: dict[str, float] = {}
        self.on_enter = on_enter  # called with a phase's name as it starts (chaos hooks in here)

    @contextmanager
    def __call__(self, name: str):
        if self.on_enter is not None:
            self.on_enter(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def reset(self) -> None:
        self.seconds = {}

    def metrics(self) -> dict:
        return {f"timing/{k}": v for k, v in self.seconds.items()}
