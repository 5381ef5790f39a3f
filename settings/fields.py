"""A config field that carries its own help and check, as TRL's GRPOConfig fields carry theirs.

    rank: int = setting(16, "LoRA rank", at_least=1)
    logger: str = setting("tensorboard", "where metrics go", choices=("tensorboard", "console"))

`check_fields(cfg)` walks a config and checks every field against what its `setting` says, with one
message shape a rule; checks that span several fields are the sections' own `check()` methods.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any


class ConfigError(ValueError):
    """A config the run cannot start with; the message says what to change."""


def setting(default: Any, help: str, *, choices: tuple | None = None, at_least: float | None = None,
            above: float | None = None, at_most: float | None = None, note: str = "", visrl: bool = False):
    """A dataclass field with its help (shown by docs and `--dry-run`) and its check: one of `choices`,
    >= `at_least`, > `above`, <= `at_most` (None passes every bound: "not set"). `note` explains the
    bound's edge in messages (e.g. "0: all"); `visrl` marks a key SkyRL does not have."""
    meta = {"help": help, "choices": choices, "at_least": at_least, "above": above, "at_most": at_most,
            "note": note, "visrl": visrl}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def section(cls, help: str):
    """A nested config section (a dataclass), with its help."""
    return dataclasses.field(default_factory=cls, metadata={"help": help})


def check_value(key: str, value, meta: dict) -> None:
    note = f" ({meta['note']})" if meta.get("note") else ""
    choices = meta.get("choices")
    for item in (value if isinstance(value, list) else [value]) if choices is not None else []:
        if item not in choices:
            raise ConfigError(f"config key '{key}' must be one of {', '.join(map(str, choices))}; got '{item}'")
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    low, above, high = meta.get("at_least"), meta.get("above"), meta.get("at_most")
    if low is not None and high is not None and not low <= value <= high:
        raise ConfigError(f"config key '{key}' must be between {low:g} and {high:g}{note}; got {value}")
    if low is not None and value < low:
        raise ConfigError(f"config key '{key}' must be >= {low:g}{note}; got {value}")
    if above is not None and high is not None and not above < value <= high:
        raise ConfigError(f"config key '{key}' must be in ({above:g}, {high:g}]{note}; got {value}")
    if above is not None and value <= above:
        raise ConfigError(f"config key '{key}' must be > {above:g}{note}; got {value}")
    if high is not None and value > high:
        raise ConfigError(f"config key '{key}' must be <= {high:g}{note}; got {value}")


def check_fields(node, prefix: str = "") -> None:
    """Every field of `node` (a config dataclass) and its sections against its own `setting`."""
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_fields(value, key + ".")
        else:
            check_value(key, value, f.metadata)


def walk(cls, prefix: str = ""):
    """(dotted key, field) of every leaf field of the config class `cls`."""
    for f in dataclasses.fields(cls):
        kind = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            yield from walk(kind, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f
