"""Load a config: YAML file + SkyRL-style dotted overrides -> validated `Config` dataclass.

Every mistake is a `ConfigError` naming the key, what was expected and, for unknown keys, the
closest valid one; the entry points turn it into exit status 2.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from envs.registry import get_environment
from settings.schema import CHOICES, UNSUPPORTED, Config

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"


class ConfigError(ValueError):
    """A config the run cannot start with; the message says what to change."""


def _field_types(cls, prefix="") -> dict[str, object]:
    """Dotted key -> annotation of every leaf field (free-form dicts count as leaves)."""
    out = {}
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            out.update(_field_types(type(default), key + "."))
        else:
            out[key] = f.type
    return out


VALID_KEYS = _field_types(Config)
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


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    layers = _file_layers(Path(path) if path else DEFAULT_CONFIG)
    for item in overrides:
        layer = _parse_override(item)
        _check_keys(layer, f"override '{item}'")
        layers.append(layer)
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
    validate(cfg)
    return cfg


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


def _get(cfg: Config, key: str):
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def validate(cfg: Config) -> None:
    """Checks that span several keys, or values a type cannot express."""
    for key, allowed in CHOICES.items():
        if _get(cfg, key) not in allowed:
            raise ConfigError(f"config key '{key}' must be one of {', '.join(map(str, allowed))}; "
                              f"got '{_get(cfg, key)}'")
    t, g, p = cfg.trainer, cfg.generator, cfg.trainer.placement
    positive = ["trainer.epochs", "trainer.train_batch_size", "trainer.policy_mini_batch_size",
                "trainer.micro_forward_batch_size_per_gpu", "trainer.micro_train_batch_size_per_gpu",
                "trainer.update_epochs_per_batch", "generator.max_turns", "generator.n_samples_per_prompt",
                "generator.inference_engine.num_engines", "generator.inference_engine.tensor_parallel_size",
                "generator.sampling_params.max_generate_length", "trainer.placement.policy_num_nodes",
                "trainer.placement.policy_num_gpus_per_node", "trainer.placement.ref_num_nodes",
                "trainer.placement.ref_num_gpus_per_node", "data.train_size", "data.eval_size",
                "data.long_route_repeats",
                "trainer.eval_interval", "trainer.ckpt_interval", "trainer.hf_save_interval",
                "environment.cell_px", "generator.max_input_length", "trainer.max_prompt_length"]
    for key in positive:
        if _get(cfg, key) < 1:
            raise ConfigError(f"config key '{key}' must be >= 1; got {_get(cfg, key)}")
    try:
        get_environment(cfg.environment.env_class)
    except ValueError as e:
        raise ConfigError(f"config key 'environment.env_class': {e}") from None
    if cfg.data.validation_size < 0:
        raise ConfigError(f"config key 'data.validation_size' must be >= 0 (0 = no validation set); "
                          f"got {cfg.data.validation_size}")
    share = cfg.data.long_route_share
    if share is not None and not 0 <= share <= 1:
        raise ConfigError(f"config key 'data.long_route_share' must be between 0 and 1 (or null: the mazes as "
                          f"drawn); got {share}")
    if not 0 <= cfg.data.junction_start_share <= 1:
        raise ConfigError(f"config key 'data.junction_start_share' must be between 0 and 1 (0: every maze starts "
                          f"at its corner); got {cfg.data.junction_start_share}")
    if not 0 <= cfg.data.replay_share <= 1:
        raise ConfigError(f"config key 'data.replay_share' must be between 0 and 1 (0: every maze is drawn once an "
                          f"epoch); got {cfg.data.replay_share}")
    if t.eval_batch_size < 0:
        raise ConfigError(f"config key 'trainer.eval_batch_size' must be >= 0 (0 = all mazes at once); got {t.eval_batch_size}")
    if t.ckpt_timeout_s <= 0:
        raise ConfigError(f"config key 'trainer.ckpt_timeout_s' must be > 0; got {t.ckpt_timeout_s}")
    a = t.algorithm
    if a.use_tis and a.use_rollout_logprobs:
        raise ConfigError("trainer.algorithm.use_tis corrects the trainer's recomputed old log-probs toward the "
                          "engines'; with use_rollout_logprobs=true the ratio is already taken against the engines' "
                          "log-probs: set one of the two")
    if t.gradient_checkpointing_use_reentrant:
        raise ConfigError("trainer.gradient_checkpointing_use_reentrant=true is not supported: reentrant "
                          "checkpointing loses the LoRA gradients when a block's input comes from the frozen base "
                          "(nothing upstream needs a gradient); leave it false")
    if a.use_tis and a.tis_imp_ratio_cap <= 0:
        raise ConfigError(f"trainer.algorithm.tis_imp_ratio_cap must be > 0; got {a.tis_imp_ratio_cap}")
    if g.eval_sampling_params.temperature < 0:
        raise ConfigError("generator.eval_sampling_params.temperature must be >= 0 (0 = greedy)")
    if t.train_batch_size % t.policy_mini_batch_size:
        raise ConfigError(f"trainer.train_batch_size ({t.train_batch_size}) must be divisible by "
                          f"trainer.policy_mini_batch_size ({t.policy_mini_batch_size})")
    if t.train_batch_size > cfg.data.train_size:
        raise ConfigError(f"trainer.train_batch_size ({t.train_batch_size}) exceeds data.train_size "
                          f"({cfg.data.train_size})")
    policy_gpus = p.policy_num_nodes * p.policy_num_gpus_per_node
    engine_gpus = g.inference_engine.num_engines * g.inference_engine.tensor_parallel_size
    if p.colocate_all and engine_gpus != policy_gpus:
        raise ConfigError(
            f"trainer.placement.colocate_all=true needs generator.inference_engine.num_engines x "
            f"tensor_parallel_size ({engine_gpus}) == policy_num_nodes x policy_num_gpus_per_node ({policy_gpus})")
    ref_shards = t.ref_source() == "shards"
    if p.colocate_all and ref_shards and p.ref_num_nodes * p.ref_num_gpus_per_node != policy_gpus:
        raise ConfigError("trainer.placement.colocate_all=true needs as many ref devices "
                          "(ref_num_nodes x ref_num_gpus_per_node) as policy devices")
    if g.inference_engine.tensor_parallel_size > 1 and g.inference_engine.backend == "hf":
        raise ConfigError("generator.inference_engine.tensor_parallel_size > 1 needs backend=vllm")
    if t.algorithm.advantage_estimator in ("grpo", "rloo", "gigpo") and g.n_samples_per_prompt < 2:
        raise ConfigError(f"{t.algorithm.advantage_estimator} compares samples of one prompt: "
                          f"generator.n_samples_per_prompt must be >= 2; got {g.n_samples_per_prompt}")
    if g.sampling_params.temperature <= 0:
        raise ConfigError("generator.sampling_params.temperature must be > 0 for training rollouts "
                          "(eval uses generator.eval_sampling_params)")
    if not 0 < g.sampling_params.top_p <= 1:
        raise ConfigError(f"generator.sampling_params.top_p must be in (0, 1]; got {g.sampling_params.top_p}")
    if t.algorithm.eps_clip_low < 0 or t.algorithm.eps_clip_high < 0:
        raise ConfigError("trainer.algorithm.eps_clip_low/high must be >= 0")
    if t.algorithm.clip_ratio_c <= 1:
        raise ConfigError(f"trainer.algorithm.clip_ratio_c must be > 1 (dual_clip caps a negative advantage's "
                          f"loss at clip_ratio_c x |A|); got {t.algorithm.clip_ratio_c}")
    if g.context_window_turns < 0 or g.context_pictures < 0:
        raise ConfigError("generator.context_window_turns and context_pictures must be >= 0 (0 keeps all)")
    if t.resume_mode == "from_path" and not t.resume_path:
        raise ConfigError("trainer.resume_mode=from_path needs trainer.resume_path")
    if t.resume_mode == "from_path" and not re.fullmatch(r"global_step_\d+", t.resume_path.rstrip("/").rsplit("/", 1)[-1]):
        raise ConfigError(f"trainer.resume_path must name a checkpoint folder ending in global_step_N; got '{t.resume_path}'")
    if not 0 < g.inference_engine.gpu_memory_utilization <= 1:
        raise ConfigError("generator.inference_engine.gpu_memory_utilization must be in (0, 1]")
    if p.timeout_s <= 0 or p.recovery_timeout_s <= 0:
        raise ConfigError("trainer.placement.timeout_s and recovery_timeout_s must be > 0 (seconds)")
    if t.max_restarts < 0:
        raise ConfigError(f"trainer.max_restarts must be >= 0; got {t.max_restarts}")
    _refuse_placeholders(cfg)


PLACEHOLDER = re.compile(r"<[A-Za-z][A-Za-z0-9_-]*>")
CHECKED_WHEN_USED = {"trainer.publish_path"}  # only `--publish` writes there: training runs with it unfilled


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
