"""Dataset rows on disk, whatever the task: one JSON object a line, each naming its `env_id` (a
registered environment, which checks the rest of the row) and its `seed`."""
from __future__ import annotations

import json
from pathlib import Path


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
