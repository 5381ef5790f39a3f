"""Files that appear whole or not at all: written beside their place, then renamed over it (a
reader, or a run killed mid-write, never sees half a file)."""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path


def write_atomic(path: Path | str, data: bytes | str, durable: bool = False) -> None:
    """Write `data` to `path` by rename; `durable` also syncs it to disk first (checkpoints)."""
    tmp = temp_beside(path)
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def temp_beside(path: Path | str) -> Path:
    """A fresh hidden name in the folder of `path`, for a file or folder about to replace it."""
    path = Path(path)
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


def replace_dir(tmp: Path | str, dest: Path | str) -> None:
    """Put the finished folder `tmp` in place of `dest`: the old one is moved aside first, so `dest`
    is at every moment either the old folder or the new one."""
    dest = Path(dest)
    if dest.exists():
        old = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.old")
        os.replace(dest, old)
        os.replace(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, dest)
