"""Calling actors the same way whether they are Ray actors or plain objects (tests, GPU boxes).

Sampling and training are separate clients, as in tinker-cookbook. `EngineClient` is the sampling
client the rollout talks to: it splits a turn's requests across the engines, calls them in
parallel and puts the results back in order. `TrainingClient` drives the policy and reference
shards: each shard's share of the items is put in the object store once, the reference log-probs
go from the ref shards to the policy shards as object refs (never through the driver).
"""
from __future__ import annotations

from typing import Any

from storage.adapters import AdapterRef


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
        self.version = 0  # the adapter version every engine holds (0: the base)

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

    def load_adapter(self, ref: AdapterRef) -> None:
        """Every engine loads `ref`, and says so."""
        loaded = call_all(self.engines, "load_adapter", [(ref,)] * len(self.engines))
        if any(v != ref.version for v in loaded):
            raise RuntimeError(f"engines report adapter versions {loaded} after loading v{ref.version}")
        self.version = ref.version

    def sleep(self):
        call_all(self.engines, "sleep")

    def wake_up(self):
        call_all(self.engines, "wake_up")

    def status(self) -> list[dict]:
        return call_all(self.engines, "status")


class TrainingClient:
    """The policy shards (FSDP ranks) and the reference shards, called as one trainer. With
    `ref_from_policy` there are no ref shards: the policy shards score the reference themselves
    (their frozen base, the adapter switched off)."""

    def __init__(self, policy: list, ref: list, ref_from_policy: bool = False):
        self.policy, self.ref, self.ref_from_policy = policy, ref, ref_from_policy

    def share(self, items: list) -> dict[int, list]:
        """{world size: its ranks' shares} for the policy's and the ref's world sizes: the items are
        split once per size and each share is put in the object store once, for whichever shards
        (policy, ref or both) use that size."""
        from rl.batch import split_for_ranks
        remote = bool(self.policy) and is_remote(self.policy[0])
        out = {}
        for n in {len(self.policy), len(self.ref)} - {0}:
            shares = split_for_ranks(items, n)
            if remote:
                import ray
                shares = [ray.put(s) for s in shares]
            out[n] = shares
        return out

    def reference_logprobs(self, shares: dict, temperature: float, micro_batch: int) -> list:
        """Start the reference scoring on the shares; the results stay object refs (dicts locally)."""
        shards, method = (self.policy, "reference_logprobs") if self.ref_from_policy else (self.ref, "logprobs")
        if not shards:
            return []
        mine = shares[len(shards)]
        if is_remote(shards[0]):
            return [getattr(h, method).remote(s, temperature, micro_batch) for h, s in zip(shards, mine)]
        return [getattr(h, method)(s, temperature, micro_batch) for h, s in zip(shards, mine)]

    def wait(self, refs: list) -> None:
        """Until the given results are ready (without fetching them to the driver)."""
        if refs and not isinstance(refs[0], dict):
            import ray
            ray.wait(refs, num_returns=len(refs))

    def train(self, shares: dict, algorithm, temperature: float, micro_batch: int, epochs: int,
              ref_logprobs: list) -> dict:
        """One update on every policy rank: its share and every ref shard's log-probs."""
        mine = shares[len(self.policy)]
        results = call_all(self.policy, "train", [(s, algorithm, temperature, micro_batch, epochs, *ref_logprobs)
                                                  for s in mine])
        return results[0]

    def save_adapter(self, folder: str) -> None:
        call_all(self.policy, "save_adapter", [(folder,)] * len(self.policy))

    def offload(self) -> float:
        """The policy shards' weights to host memory while colocated engines generate; the GiB one moved."""
        return max(call_all(self.policy, "offload"), default=0.0)

    def reload(self) -> None:
        call_all(self.policy, "reload")

    def state_dict(self) -> dict:
        return call_all(self.policy, "state_dict")[0]

    def load_state_dict(self, state: dict) -> None:
        call_all(self.policy, "load_state_dict", [(state,)] * len(self.policy))

    def load_adapter_weights(self, lora: dict) -> None:
        call_all(self.policy, "load_adapter_weights", [(lora,)] * len(self.policy))
