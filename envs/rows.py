"""Dataset rows on disk, whatever the task: one JSON object a line, each naming its `env_id` (a
registered environment, which checks the rest of the row) and its `seed`."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from storage.atomic import write_atomic


def rows_bytes(rows) -> bytes:
    return "".join(json.dumps(r, separators=(",", ":"), sort_keys=True) + "\n" for r in rows).encode()


def load_rows(path) -> list[dict]:
    from envs.registry import get_environment
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset file '{path}' does not exist; write one with "
                                f"`python driver.py --make-dataset DIR`")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            row = json.loads(line)
            _ = row["seed"], row["env_id"]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{n} is not a task row ({e!r}: a JSON object with seed and env_id)") from None
        try:
            get_environment(row["env_id"]).check_row(row)
        except ValueError as e:
            raise ValueError(f"{path}:{n} is {e}") from None
        rows.append(row)
    return rows


def seed_splits(make, train_size: int, eval_size: int, train_seed_start: int, eval_seed_start: int,
                validation_size: int = 0, validation_seed_start: int = 0) -> list[tuple[str, list[dict], int, int]]:
    """Train, eval and (with validation_size) validation rows from disjoint seed ranges, as
    [(name, rows, first seed, seeds scanned)]; `make(split, first seed, count, seed limit)` returns
    (rows, seeds scanned) for one split."""
    if eval_seed_start < train_seed_start:
        raise ValueError("eval_seed_start must be above train_seed_start (disjoint ranges)")
    train, train_scanned = make("train", train_seed_start, train_size, eval_seed_start)
    evals, eval_scanned = make("eval", eval_seed_start, eval_size, None)
    splits = [("train", train, train_seed_start, train_scanned), ("eval", evals, eval_seed_start, eval_scanned)]
    if validation_size:
        if validation_seed_start < eval_seed_start + eval_scanned:
            raise ValueError(f"validation_seed_start ({validation_seed_start}) must be above the eval seeds "
                             f"[{eval_seed_start}, {eval_seed_start + eval_scanned}) (disjoint ranges)")
        validation, scanned = make("validation", validation_seed_start, validation_size, None)
        splits.append(("validation", validation, validation_seed_start, scanned))
    return splits


def write_splits(out: Path, manifest: dict, splits: list[tuple[str, list[dict], int, int]]) -> dict:
    """Write each split [(name, rows, first seed, seeds scanned)] to <name>.jsonl, then manifest.json
    (`manifest` with each split's rows, seed range, checksum and optimal-move histogram added).
    The same rows always give byte-identical files."""
    for name, rows, start, scanned in splits:
        data = rows_bytes(rows)
        write_atomic(out / f"{name}.jsonl", data)
        manifest["splits"][name] = {
            "file": f"{name}.jsonl", "rows": len(rows), "seed_range": [start, start + scanned],
            "skipped_by_filter": scanned - len(rows), "sha256": hashlib.sha256(data).hexdigest(),
            "optimal_moves": _histogram(r["optimal_moves"] for r in rows)}
    write_atomic(out / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def _histogram(values) -> dict:
    counts = {}
    for v in values:
        counts[str(v)] = counts.get(str(v), 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0])))
