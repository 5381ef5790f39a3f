"""Where a PEFT LoRA adapter's files sit in a store: a folder that holds them, or a training run's
export (`global_step_N/`, whose `policy/` holds them). One rule for `--adapter`, the serve app and
its adapter registry."""
from __future__ import annotations

import re

from storage.store import join

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
LAYOUTS = ("", "policy")  # the adapter folder itself, or a run export's policy/
NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")  # an adapter's name: a path part and half of a model id


def check_name(name, what: str = "adapter name") -> str:
    """`name` if it is a valid adapter name (matched whole: no trailing newline slips by), else ValueError."""
    if not isinstance(name, str) or not NAME.fullmatch(name) or set(name) == {"."}:
        raise ValueError(f"{what}: invalid adapter name {name!r}; use 1-128 letters, digits, '.', '_' and '-' "
                         "(not only dots)")
    return name


def adapter_prefix(store, key: str = "") -> str | None:
    """The key under `store` (`key`, or `key`/policy) that holds both adapter files; None if neither does."""
    for layout in LAYOUTS:
        prefix = join(key, layout)
        if all(store.exists(join(prefix, f)) for f in ADAPTER_FILES):
            return prefix
    return None


PROVENANCE = "provenance.json"  # beside a published adapter's files: where it came from


class PublishError(ValueError):
    """A publish that would serve the wrong thing; the message says what to change."""


def publish(source: str, prefix: str, name: str, provenance: dict, force: bool = False, s3_cfg=None) -> str:
    """Publish the adapter at `source` (a folder or s3:// prefix holding the adapter files, or its
    `policy/`) as `<prefix>/<name>/`: the adapter files and provenance.json (`provenance`, which names
    the `base_model` it is for). What ray.serve.llm's `dynamic_lora_loading_path` and the serve app read.

    Readers never see half an adapter: in a folder the new one appears by rename; on S3
    adapter_config.json, which every reader needs, is written last (and removed first when `force`
    replaces a name, so a reader in that window finds no adapter rather than a mix of two). Refused,
    before anything is written: an invalid name, a name already published (without `force`), an
    adapter trained on another base, or a prefix that serves another base. Returns `<prefix>/<name>`."""
    import json
    import tempfile
    from pathlib import Path

    from storage.store import LocalStore, open_store
    check_name(name, "publish")
    base = str(provenance.get("base_model") or "")
    if not base:
        raise PublishError("publish: the provenance must name the base_model the adapter is for")
    src = open_store(source, s3_cfg)
    found = adapter_prefix(src)
    if found is None:
        raise PublishError(f"publish: '{source}' holds no {' and '.join(ADAPTER_FILES)}; give an adapter folder "
                           "(a run exports them to <export_path>/global_step_N/policy)")
    trained_on = json.loads(src.get_bytes(join(found, "adapter_config.json"))).get("base_model_name_or_path") or ""
    if trained_on and _base_name(trained_on) != _base_name(base):
        raise PublishError(f"publish: the adapter at '{source}' was trained on '{trained_on}', not '{base}'; "
                           "publish it for the base it was trained on")
    dest = open_store(prefix, s3_cfg)
    for other in dest.list_dirs():
        if other != name and dest.exists(join(other, PROVENANCE)):
            served = json.loads(dest.get_bytes(join(other, PROVENANCE))).get("base_model", "")
            if served and _base_name(served) != _base_name(base):
                raise PublishError(f"publish: '{prefix}' serves adapters of '{served}' (e.g. '{other}'), not '{base}'; "
                                   "publish under a prefix of its own for each base model")
    if dest.exists(join(name, "adapter_config.json")) and not force:
        raise PublishError(f"publish: '{prefix}/{name}' exists already; choose another name (a new name per "
                           "version lets clients move when you say so), or pass --force to replace it")
    with tempfile.TemporaryDirectory() as tmp:
        for f in ADAPTER_FILES:
            (Path(tmp) / f).write_bytes(src.get_bytes(join(found, f)))
        (Path(tmp) / PROVENANCE).write_text(json.dumps({"name": name, **provenance}, indent=2, default=str) + "\n")
        if force and dest.exists(join(name, "adapter_config.json")) and not isinstance(dest, LocalStore):
            dest.delete(join(name, "adapter_config.json"))
        dest.upload_dir(tmp, name, last="adapter_config.json")
    return str(Path(dest.url) / name) if isinstance(dest, LocalStore) else join(dest.url, name)


def _base_name(path: str) -> str:
    """A base model's name as adapters record it: the last part of its path or hub id."""
    return str(path).rstrip("/").rsplit("/", 1)[-1]
