"""The LoRA adapter, from training to serving, in one place.

An adapter is a PEFT folder (adapter_config.json and adapter_model.safetensors) in a store (a local
or shared folder, or an S3 prefix). Training writes versions to shared storage for the engines
(`AdapterRef`, pruned to the newest few), exports `<export_path>/global_step_N/policy/` and, with a
validation set, `<export_path>/best/policy/` with selection.json; `publish` puts the chosen one under a
serving prefix as `<prefix>/<name>/` with provenance.json, which is what ray.serve.llm's
`dynamic_lora_loading_path` and the serve app read (`<base_id>:<name>`). Every reader finds an
adapter's files the same way (`find`), and adapter names follow one rule (`check_name`).
"""
from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from storage.store import LocalStore, StorageError, is_s3, join, open_store

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
LAYOUTS = ("", "policy")  # the adapter folder itself, or a run export's policy/
NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")  # an adapter's name: a path part and half of a model id
PROVENANCE = "provenance.json"  # beside a published adapter's files: where it came from
SELECTION = "selection.json"  # beside <export_path>/best/policy: the step and scores that chose it


class AdapterError(ValueError):
    """An adapter that cannot be used as asked; the message says what to change."""


@dataclass(frozen=True)
class AdapterRef:
    """A LoRA adapter version on shared storage: what the policy hands the engines after a sync."""
    path: str
    version: int


def check_name(name, what: str = "adapter name") -> str:
    """`name` if it is a valid adapter name (matched whole: no trailing newline slips by), else AdapterError."""
    if not isinstance(name, str) or not NAME.fullmatch(name) or set(name) == {"."}:
        raise AdapterError(f"{what}: invalid adapter name {name!r}; use 1-128 letters, digits, '.', '_' and '-' "
                           "(not only dots)")
    return name


def adapter_prefix(store, key: str = "") -> str | None:
    """The key under `store` (`key`, or `key`/policy) that holds both adapter files; None if neither does."""
    for layout in LAYOUTS:
        prefix = join(key, layout)
        if all(store.exists(join(prefix, f)) for f in ADAPTER_FILES):
            return prefix
    return None


def find(path: str, s3_cfg=None, what: str = "--adapter") -> str:
    """The adapter `path` names (a folder or s3:// prefix): the place itself, or an export's `policy/`."""
    if not is_s3(path) and not Path(path).is_dir():
        raise AdapterError(f"{what} '{path}' is not a folder; give an adapter folder such as "
                           f"runs/default/exports/global_step_64/policy")
    try:
        prefix = adapter_prefix(open_store(path, s3_cfg))
    except StorageError as e:
        raise AdapterError(f"{what} '{path}': {e}") from None
    if prefix is None:
        raise AdapterError(f"{what} '{path}' holds no {' and '.join(ADAPTER_FILES)}; give a PEFT adapter folder "
                           f"(a run exports them to <export_path>/global_step_N/policy)")
    return join(path, prefix) if is_s3(path) else str(Path(path, prefix))


def read_config(folder: str, s3_cfg=None) -> dict:
    return json.loads(open_store(folder, s3_cfg).get_bytes("adapter_config.json"))


def read_weights(folder: str, s3_cfg=None) -> dict:
    """The LoRA tensors of an adapter folder or s3:// prefix (safetensors: nothing is unpickled)."""
    from safetensors.torch import load
    return load(open_store(folder, s3_cfg).get_bytes("adapter_model.safetensors"))


def export(adapter: AdapterRef, export_path: str, step: int, s3_cfg=None) -> None:
    """{export_path}/global_step_N/policy/: the PEFT adapter the serve app, --adapter and publish read."""
    open_store(export_path, s3_cfg).upload_dir(adapter.path, f"global_step_{step}/policy")


def export_best(adapter: AdapterRef, export_path: str, selection: dict, s3_cfg=None) -> None:
    """{export_path}/best/policy/ and selection.json beside it (`selection`: step and scores), together."""
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(adapter.path, Path(tmp) / "policy")
        (Path(tmp) / SELECTION).write_text(json.dumps(selection, indent=2) + "\n")
        open_store(export_path, s3_cfg).upload_dir(tmp, "best")


def exported_best(export_path: str, s3_cfg=None) -> dict | None:
    """The selection.json of the adapter exported as best, if any."""
    store = open_store(export_path, s3_cfg)
    key = f"best/{SELECTION}"
    return json.loads(store.get_bytes(key)) if store.exists(key) else None


def exported_steps(export_path: str, s3_cfg=None) -> list[int]:
    """The steps exported under export_path (global_step_N), in order."""
    return sorted(int(d.rsplit("_", 1)[1]) for d in open_store(export_path, s3_cfg).list_dirs()
                  if re.fullmatch(r"global_step_\d+", d))


def version_ref(adapters_dir: Path, version: int) -> AdapterRef | None:
    """Version `version` in a run's adapters/ folder (v1, v2, ...); None for 0, the base."""
    return AdapterRef(str(Path(adapters_dir) / f"v{version}"), version) if version else None


def prune_versions(folder: Path, keep: int, current: int) -> None:
    """Keep the `keep` versions up to `current` in a run's adapters/ folder (v1, v2, ...); remove the
    older ones, and any newer one: left by steps a recovery went back on, it would crowd out a
    version still in use (one-step-off samples with the one before `current`)."""
    versions = sorted(int(p.name[1:]) for p in folder.glob("v*") if p.name[1:].isdigit())
    kept = [v for v in versions if v <= current][-keep:]
    for v in versions:
        if v not in kept:
            shutil.rmtree(folder / f"v{v}", ignore_errors=True)


def publish(source: str, prefix: str, name: str, provenance: dict, force: bool = False, s3_cfg=None) -> str:
    """Publish the adapter at `source` (a folder or s3:// prefix holding the adapter files, or its
    `policy/`) as `<prefix>/<name>/`: the adapter files and provenance.json (`provenance`, which names
    the `base_model` it is for). Returns `<prefix>/<name>`.

    Readers never see half an adapter: in a folder the new one appears by rename; on S3
    adapter_config.json, which every reader needs, is written last (and removed first when `force`
    replaces a name, so a reader in that window finds no adapter rather than a mix of two). Refused,
    before anything is written: an invalid name, a name already published (without `force`), an
    adapter trained on another base, a prefix that serves another base."""
    check_name(name, "publish")
    base = str(provenance.get("base_model") or "")
    if not base:
        raise AdapterError("publish: the provenance must name the base_model the adapter is for")
    found = find(source, s3_cfg, "publish: the adapter")
    trained_on = read_config(found, s3_cfg).get("base_model_name_or_path") or ""
    if trained_on and _base_name(trained_on) != _base_name(base):
        raise AdapterError(f"publish: the adapter at '{source}' was trained on '{trained_on}', not '{base}'; "
                           "publish it for the base it was trained on")
    dest = open_store(prefix, s3_cfg)
    for other in dest.list_dirs():
        if other != name and dest.exists(join(other, PROVENANCE)):
            served = json.loads(dest.get_bytes(join(other, PROVENANCE))).get("base_model", "")
            if served and _base_name(served) != _base_name(base):
                raise AdapterError(f"publish: '{prefix}' serves adapters of '{served}' (e.g. '{other}'), not '{base}'; "
                                   "publish under a prefix of its own for each base model")
    exists = dest.exists(join(name, "adapter_config.json"))
    if exists and not force:
        raise AdapterError(f"publish: '{prefix}/{name}' exists already; choose another name (a new name per "
                           "version lets clients move when you say so), or pass --force to replace it")
    src = open_store(found, s3_cfg)
    with tempfile.TemporaryDirectory() as tmp:
        for f in ADAPTER_FILES:
            (Path(tmp) / f).write_bytes(src.get_bytes(f))
        (Path(tmp) / PROVENANCE).write_text(json.dumps({"name": name, **provenance}, indent=2, default=str) + "\n")
        if exists and not isinstance(dest, LocalStore):
            dest.delete(join(name, "adapter_config.json"))
        dest.upload_dir(tmp, name, last="adapter_config.json")
    return str(Path(dest.url) / name) if isinstance(dest, LocalStore) else join(dest.url, name)


def _base_name(path: str) -> str:
    """A base model's name as adapters record it: the last part of its path or hub id."""
    return str(path).rstrip("/").rsplit("/", 1)[-1]
