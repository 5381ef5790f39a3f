"""Load a config: YAML file + SkyRL-style dotted overrides -> validated `Config` dataclass.

Every mistake is a `ConfigError` naming the key, what was expected and, for unknown keys, the
closest valid one; the entry points turn it into exit status 2.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from settings.fields import ConfigError, walk
from settings.schema import Config
from settings.skyrl import UNSUPPORTED

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"


VALID_KEYS = {key: f.type for key, f in walk(Config)}  # dotted key -> annotation (free-form dicts are leaves)
_FREE_FORM = {k for k, t in VALID_KEYS.items() if str(t).startswith("Dict")}


def closest_key(key: str) -> str | None:
    keys = list(VALID_KEYS)
    match = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if match:
        return match[0]
    leaf = key.rsplit(".", 1)[-1]
    by_leaf = difflib.get_close_matches(leaf, [k.rsplit(".", 1)[-1] for k in keys], n=1, cutoff=0.6)
    return next((k for k in keys if by_leaf and k.endswith("." + by_leaf[0])), None)


def _leaf_keys(node, prefix=""):
    """Dotted keys of a user's config, stopping at free-form sections."""
    for name, value in node.items():
        key = f"{prefix}{name}"
        if isinstance(value, (dict, DictConfig)) and key not in _FREE_FORM and value:
            yield from _leaf_keys(value, key + ".")
        else:
            yield key, value


def _check_keys(node, source: str):
    if not isinstance(node, (dict, DictConfig)):
        raise ConfigError(f"{source}: expected a mapping of config keys at the top level")
    for key, _ in _leaf_keys(node):
        if key in VALID_KEYS or any(key.startswith(f + ".") for f in _FREE_FORM):
            continue
        reason = next((why for k, why in UNSUPPORTED.items() if key == k or key.startswith(k + ".")), None)
        if reason:
            raise ConfigError(f"{source}: '{key}' is a SkyRL key that visrl does not support: {reason} "
                              f"(docs/configuration.md lists them)")
        section_keys = [v for v in VALID_KEYS if v.startswith(key + ".")]
        if section_keys:
            raise ConfigError(f"{source}: '{key}' is a section, not a value; set its keys, "
                              f"e.g. '{section_keys[0]}=...'")
        hint = closest_key(key)
        raise ConfigError(f"{source}: unknown config key '{key}'"
                          + (f"; did you mean '{hint}'?" if hint else "; see settings/schema.py for the keys"))


def _parse_override(item: str) -> DictConfig:
    if "=" not in item or item.startswith("="):
        raise ConfigError(f"override '{item}' is not of the form key=value (e.g. trainer.epochs=3)")
    try:
        return OmegaConf.from_dotlist([item])
    except OmegaConfBaseException as e:
        raise ConfigError(f"override '{item}' cannot be parsed: {e}") from None


def _file_layers(path: Path, chain: tuple[Path, ...] = ()) -> list[DictConfig]:
    """The file's settings, after those of the file its `extends:` names (a path beside it), and so on:
    a later stage of a curriculum says only what it changes."""
    if not path.is_file():
        named_by = f" (named by `extends:` in '{chain[-1]}')" if chain else ""
        raise ConfigError(f"config file '{path}'{named_by} does not exist; shipped configs are in configs/")
    if path.resolve() in [p.resolve() for p in chain]:
        raise ConfigError(f"config file '{path}' extends itself through {' -> '.join(map(str, chain))}")
    try:
        user = OmegaConf.load(path)
    except Exception as e:  # YAML syntax errors come in several types
        raise ConfigError(f"config file '{path}' is not valid YAML: {e}") from None
    parent = user.pop("extends", None) if isinstance(user, DictConfig) else None
    _check_keys(user, str(path))
    if parent is None:
        return [user]
    if not isinstance(parent, str):
        raise ConfigError(f"config file '{path}': `extends:` expects the path of another config file")
    return _file_layers(path.parent / parent, chain + (path,)) + [user]


_NAME_LISTS = [k for k, t in VALID_KEYS.items() if str(t) in ("List[str]", "typing.List[str]")]


def _names_as_lists(layer: DictConfig) -> DictConfig:
    """A list-of-names key given one name (`trainer.logger=wandb`, as SkyRL's older form) is a list of one."""
    for key in _NAME_LISTS:
        value = OmegaConf.select(layer, key, default=None)
        if isinstance(value, str):
            OmegaConf.update(layer, key, [value], merge=False)
    return layer


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    layers = [_names_as_lists(layer) for layer in _file_layers(Path(path) if path else DEFAULT_CONFIG)]
    for item in overrides:
        layer = _parse_override(item)
        _check_keys(layer, f"override '{item}'")
        layers.append(_names_as_lists(layer))
    merged = OmegaConf.structured(Config)
    for layer in layers:
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as e:
            key = getattr(e, "full_key", None) or "?"
            expected = VALID_KEYS.get(key, "another type")
            expected = getattr(expected, "__name__", str(expected)).replace("typing.", "")
            detail = str(getattr(e, "msg", e)).splitlines()[0]
            raise ConfigError(f"config key '{key}' expects {expected} ({detail})") from None
    cfg: Config = OmegaConf.to_object(merged)
    cfg.check()
    _refuse_placeholders(cfg)
    return cfg


def parse_with_overrides(ap: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """`ap`'s arguments, with every `key=value` override of the command line in `.overrides` wherever
    it stands: an option of several values (`--workloads decode`) would otherwise take the overrides
    after it for its own values and refuse them."""
    argv = sys.argv[1:] if argv is None else list(argv)
    is_override = [("=" in a and not a.startswith("-")) for a in argv]
    args = ap.parse_args([a for a, o in zip(argv, is_override) if not o])
    args.overrides = [a for a, o in zip(argv, is_override) if o]
    return args


def typed_settings(schema, values: dict | None, what: str):
    """An instance of the dataclass `schema` from `values` (strings such as `serve run`'s key=value
    arguments converted to each field's type), with errors that name the `what` at fault."""
    known = [f.name for f in dataclasses.fields(schema)]
    for key in values or {}:
        if key not in known:
            hint = difflib.get_close_matches(key, known, n=1)
            raise ConfigError(f"unknown {what} '{key}'" + (f"; did you mean '{hint[0]}'?" if hint else "")
                              + f" (known: {', '.join(known)})")
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), values or {}))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        kind = next((type(f.default).__name__ for f in dataclasses.fields(schema) if f.name == key), "another type")
        raise ConfigError(f"{what} '{key}' expects {kind}, got {(values or {}).get(key)!r}") from None


PLACEHOLDER = re.compile(r"<[A-Za-z][A-Za-z0-9_-]*>")
CHECKED_WHEN_USED = {"trainer.publish_path"}  # only tools/publish.py writes there: training runs with it unfilled


def refuse_placeholder(key: str, value) -> None:
    """A value still holding a template's placeholder (`s3://<bucket>/...`) would become a real folder
    or bucket name."""
    found = PLACEHOLDER.search(value) if isinstance(value, str) else None
    if found:
        example = PLACEHOLDER.sub(lambda m: "my-" + m.group()[1:-1], value)
        raise ConfigError(f"config key '{key}' still holds the placeholder {found.group()} ('{value}'): "
                          f"replace it, e.g. {key}={example}")


def _refuse_placeholders(node, prefix: str = "") -> None:
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            _refuse_placeholders(value, key + ".")
        elif key not in CHECKED_WHEN_USED:
            for item in (value if isinstance(value, list) else [value]):
                refuse_placeholder(key, item)


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
