"""Where adapters come from and which ones are resident.

AdapterSource lists and fetches PEFT adapters under `dynamic_lora_loading_path` (a local folder
or s3:// prefix): `<root>/<name>/adapter_config.json`, or a training run's export layout
`<root>/<name>/policy/adapter_config.json` (so `runs/x/exports` serves `global_step_N`). Names are
validated before they touch a path. ResidentAdapters keeps at most `max_loras` loaded, evicts the
least recently used, and makes concurrent first requests for one adapter share a single load.
"""
from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections import OrderedDict
from pathlib import Path

from serving.errors import APIError
from storage import StorageError, open_store
from storage.adapters import ADAPTER_FILES, NAME, adapter_prefix, check_name
from storage.atomic import replace_dir, temp_beside

log = logging.getLogger("visrl.serve")


def validate_name(name: str) -> str:
    try:
        return check_name(name)
    except ValueError:
        raise APIError(400, f"invalid adapter name {name!r}: use letters, digits, '.', '_' and '-' only", "model") from None


class AdapterSource:
    def __init__(self, root: str | None, cache_dir: str, base_name: str, max_lora_rank: int, s3_cfg=None):
        self.root, self.base_name, self.max_lora_rank = root, base_name, max_lora_rank
        self.store = open_store(root, s3_cfg) if root else None
        self.cache = Path(cache_dir)
        self.cache.mkdir(parents=True, exist_ok=True)

    def names(self) -> list[str]:
        if self.store is None:
            return []
        try:
            dirs = self.store.list_dirs()
        except StorageError as e:  # the base model still serves; say why the adapters are missing
            log.warning("cannot list adapters under %s: %s", self.root, e)
            return []
        return [d for d in dirs if NAME.fullmatch(d) and self._prefix(d) is not None]

    def _prefix(self, name: str) -> str | None:
        try:
            return adapter_prefix(self.store, name)
        except StorageError:
            return None

    def fetch(self, name: str) -> tuple[str, float]:
        """(local folder, download seconds): copied from the source into the replica's disk cache."""
        validate_name(name)
        if self.store is None:
            raise APIError(404, f"adapter '{name}' not found: this server has no dynamic_lora_loading_path", "model")
        prefix = self._prefix(name)
        if prefix is None:
            raise APIError(404, f"adapter '{name}' not found; GET /v1/models lists the models",
                           "model")
        dest = self.cache / name
        start = time.perf_counter()
        tmp = temp_beside(dest)
        tmp.mkdir()
        try:
            for f in ADAPTER_FILES:
                (tmp / f).write_bytes(self.store.get_bytes(f"{prefix}/{f}"))
        except StorageError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            log.warning("download of adapter %s failed: %s", name, e)  # where from stays in the server's log
            raise APIError(503, f"adapter '{name}' could not be downloaded from the adapter store; try again") from None
        self.check(name, tmp)
        replace_dir(tmp, dest)
        return str(dest), time.perf_counter() - start

    def check(self, name: str, folder: Path) -> None:
        try:
            cfg = json.loads((folder / "adapter_config.json").read_text())
        except ValueError:
            raise APIError(400, f"adapter '{name}' has an unreadable adapter_config.json") from None
        if cfg.get("peft_type", "LORA") != "LORA":
            raise APIError(400, f"adapter '{name}' is {cfg.get('peft_type')}, only LoRA adapters are served")
        rank = cfg.get("r", 0)
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise APIError(400, f"adapter '{name}' has no integer LoRA rank 'r' in adapter_config.json")
        if rank > self.max_lora_rank:
            raise APIError(400, f"adapter '{name}' has LoRA rank {rank}; this server allows max_lora_rank="
                                f"{self.max_lora_rank}")
        base = Path(str(cfg.get("base_model_name_or_path") or "")).name
        if base and base != self.base_name:
            raise APIError(400, f"adapter '{name}' was trained on base '{base}'; this server serves '{self.base_name}'")


class ResidentAdapters:
    """LRU set of adapters loaded into the model, with one load per adapter however many ask.

    `fetch(name) -> folder` downloads and validates (nothing resident changes if it fails);
    `apply(name, folder)` loads into the model; `unload(name)` removes. Callers run `ensure`
    while the model is otherwise idle (the serve app's batch handler is the only caller).
    """

    def __init__(self, max_loras: int, fetch, apply, unload, metrics=None):
        self.max_loras, self._fetch, self._apply, self._unload = max_loras, fetch, apply, unload
        self.resident: OrderedDict[str, float] = OrderedDict()  # name -> cold-load seconds
        self._pending: dict[str, asyncio.Future] = {}
        self.metrics = metrics or {}
        self.hits = self.misses = self.evictions = 0

    async def ensure(self, name: str) -> float:
        """Make `name` resident; returns its cold-load seconds (0 when it was already resident)."""
        if name in self.resident:
            self.resident.move_to_end(name)
            self._count("hits")
            return 0.0
        pending = self._pending.get(name)
        if pending is None:
            self._count("misses")
            pending = asyncio.ensure_future(asyncio.to_thread(self._load, name))
            self._pending[name] = pending
            pending.add_done_callback(lambda _: self._pending.pop(name, None))
        return await asyncio.shield(pending)

    def _load(self, name: str) -> float:
        start = time.perf_counter()
        folder = self._fetch(name)
        while len(self.resident) >= self.max_loras:
            old, _ = self.resident.popitem(last=False)
            self._unload(old)
            self._count("evictions")
        self._apply(name, folder)
        seconds = time.perf_counter() - start
        self.resident[name] = seconds
        return seconds

    def preload(self, name: str) -> None:
        """Load at start-up, before any request (pre-warming)."""
        if name not in self.resident and len(self.resident) < self.max_loras:
            self._load(name)

    def _count(self, what: str) -> None:
        setattr(self, what, getattr(self, what) + 1)
        counter = self.metrics.get(what)
        if counter is not None:
            counter.inc()
