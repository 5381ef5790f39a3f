"""What a run reads before it starts, checked before anything is written: the model path, the
datasets, an adapter to evaluate, and whether the first prompt fits.

Every problem is an InputError whose one-line message names the input, says what is wrong with it
and what to do; the driver turns it into exit status 2.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from envs.base import Environment
from envs.registry import get_environment
from envs.rows import load_rows
from settings import Config, ConfigError
from storage import adapters, is_s3
from vlm.chat import ChatPrompter
from vlm.load import model_source


class InputError(ValueError):
    """A file or path the user gave that the run cannot use; the message says what to do."""


def check_model_path(path: str, key: str = "trainer.policy.model.path") -> None:
    try:
        model_source(path)
    except FileNotFoundError as e:
        raise InputError(f"{key}: {e}") from None


def read_rows(path, name: str, env_id: str | None) -> list[dict]:
    """Task rows of `path` (named `name` in messages), at least one, all of environment `env_id` (of
    its parts, for a mix), or of any tasks where env_id is None (an eval set evaluated as it is)."""
    try:
        rows = load_rows(path)
    except (FileNotFoundError, ValueError) as e:
        raise InputError(f"{name} '{path}': {e}") from None
    if not rows:
        raise InputError(f"{name} '{path}' holds no rows; write a set with `python driver.py --make-dataset DIR`")
    found = sorted({r["env_id"] for r in rows})
    other = [] if env_id is None else sorted(set(found) - {task.name for task in get_environment(env_id).parts()})
    if other:
        raise InputError(f"{name} '{path}' holds {', '.join(other)} rows but environment.env_class is {env_id}; "
                         f"pass a set of {env_id} rows or set environment.env_class")
    return rows


def environment_of(cfg: Config) -> Environment:
    return get_environment(cfg.environment.env_class)


def check_environment(cfg: Config) -> None:
    """environment.env_class names a registered task (or a package.module:Class that is one), and
    the data keys that move train starts off a route are set only for tasks that have one."""
    try:
        environment = environment_of(cfg)
    except ValueError as e:
        raise ConfigError(f"config key 'environment.env_class': {e}") from None
    routeless = [task.name for task in environment.parts() if not task.route_starts]
    for key in ("junction_start_share", "detour_start_share"):
        if getattr(cfg.data, key) and routeless:
            raise ConfigError(f"config key 'data.{key}': moves train starts along a maze's route, and "
                              f"{', '.join(routeless)} has none; set data.{key}=0 for environment.env_class="
                              f"{cfg.environment.env_class}")


def write_run_dataset(cfg: Config, folder) -> dict:
    """Write the config's train, eval (and validation) sets into folder; return the manifest."""
    return environment_of(cfg).write_dataset(Path(folder), cfg.data, cfg.generator.max_turns)


def load_datasets(cfg: Config) -> tuple[list[dict], list[dict]]:
    """The run's train and eval rows. data.eval_set, if given, is checked first; the run's own
    dataset folder is written on first use."""
    env_id, d = cfg.environment.env_class, cfg.data
    if d.eval_set:
        eval_rows = read_rows(d.eval_set, "data.eval_set", env_id)
    folder = Path(d.dataset_dir)
    if not (folder / "manifest.json").exists():
        write_run_dataset(cfg, folder)
    check_dataset_matches(cfg, folder)
    train_rows = read_rows(folder / "train.jsonl", "data.dataset_dir", env_id)
    if not d.eval_set:
        eval_rows = read_rows(folder / "eval.jsonl", "data.dataset_dir", env_id)
    return train_rows, eval_rows


def check_dataset_matches(cfg: Config, folder: Path) -> None:
    """A dataset folder is written once, on first use: one written under other settings (an earlier
    default's data.train_size, say) would otherwise be trained on silently. A validation split is
    checked where the config asks for one (a folder may carry one the config does not use)."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        splits = manifest["splits"]
        written = {"environment.env_class": manifest["env_id"], "generator.max_turns": manifest["max_turns"],
                   "data.solvable_only": manifest["filter"]["solvable_only"],
                   "data.long_route_share": manifest["filter"].get("train_long_route_share"),
                   "data.junction_start_share": manifest["filter"].get("train_junction_start_share", 0.0),
                   "data.detour_start_share": manifest["filter"].get("train_detour_start_share", 0.0),
                   "data.train_size": splits["train"]["rows"], "data.train_seed_start": splits["train"]["seed_range"][0],
                   "data.eval_size": splits["eval"]["rows"], "data.eval_seed_start": splits["eval"]["seed_range"][0]}
        validation = splits.get("validation")
        if validation:
            written |= {"data.validation_size": validation["rows"],
                        "data.validation_seed_start": validation["seed_range"][0]}
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise InputError(f"data.dataset_dir '{folder}': manifest.json is unreadable ({e}); point data.dataset_dir "
                         f"at a new folder (it is written on first use)") from None
    d = cfg.data
    wanted = {"environment.env_class": cfg.environment.env_class, "generator.max_turns": cfg.generator.max_turns,
              "data.solvable_only": d.solvable_only, "data.long_route_share": d.long_route_share,
              "data.junction_start_share": d.junction_start_share, "data.detour_start_share": d.detour_start_share,
              "data.train_size": d.train_size, "data.train_seed_start": d.train_seed_start,
              "data.eval_size": d.eval_size, "data.eval_seed_start": d.eval_seed_start}
    if d.validation_size:
        if not validation:
            raise InputError(f"data.dataset_dir '{folder}' was written without a validation split; point data.dataset_dir "
                             f"at a new folder (it is written on first use) or set data.validation_size=0")
        wanted |= {"data.validation_size": d.validation_size, "data.validation_seed_start": d.validation_seed_start}
    differ = [f"{k}={written[k]} (the config has {v})" for k, v in wanted.items() if written[k] != v]
    if differ:
        raise InputError(f"data.dataset_dir '{folder}' was written with {', '.join(differ)}; point data.dataset_dir "
                         f"at a new folder (it is written on first use), or remove this one")


def load_validation(cfg: Config) -> list[dict]:
    """The validation rows that choose the run's best adapter (none with data.validation_size=0).
    Call after load_datasets, which writes the folder on first use and checks it has them."""
    if not cfg.data.validation_size:
        return []
    return read_rows(Path(cfg.data.dataset_dir) / "validation.jsonl", "data.dataset_dir", cfg.environment.env_class)


def adapter_folder(path: str, s3_cfg=None, key: str = "--adapter") -> str:
    """The PEFT adapter `key` names (a folder or s3:// prefix): the place itself, or an export's `policy/`."""
    try:
        return adapters.find(path, s3_cfg, key)
    except adapters.AdapterError as e:
        raise InputError(str(e)) from None


def initial_adapter(cfg: Config) -> str | None:
    """trainer.policy.model.lora.init_from, checked against the run's LoRA before any actor starts:
    the adapter folder, or None (the run starts from the base)."""
    lora, key = cfg.trainer.policy.model.lora, "trainer.policy.model.lora.init_from"
    if not lora.init_from:
        return None
    if not is_s3(lora.init_from) and not Path(lora.init_from).exists():
        raise InputError(f"{key} '{lora.init_from}' does not exist; train the stage it names first (its run "
                         f"exports the adapter there), or set {key}=null to start from the base")
    folder = adapter_folder(lora.init_from, cfg.s3, key)
    saved = adapters.read_config(folder, cfg.s3)
    if saved.get("r") != lora.rank:
        raise InputError(f"{key} '{lora.init_from}' has LoRA rank {saved.get('r')} but trainer.policy.model.lora.rank "
                         f"is {lora.rank}; set the rank it was trained with")
    if saved.get("lora_alpha") != lora.alpha:  # the adapter's output scales with alpha / rank
        raise InputError(f"{key} '{lora.init_from}' has LoRA alpha {saved.get('lora_alpha')} but trainer.policy.model."
                         f"lora.alpha is {lora.alpha}; set the alpha it was trained with")
    adapted = sorted(saved.get("target_modules") or [])
    if lora.target_modules != "all-linear" and set(lora.target_modules.split(",")) != set(adapted):
        raise InputError(f"{key} '{lora.init_from}' adapts {','.join(adapted)} but trainer.policy.model.lora."
                         f"target_modules is {lora.target_modules}; set the modules it was trained with")
    return folder


def make_prompters(processor, cfg: Config) -> dict[str, ChatPrompter]:
    """The run's chat prompters, one a task its environment holds (env_id -> prompter)."""
    return {task.name: task_prompter(processor, task, cfg.environment.cell_px) for task in environment_of(cfg).parts()}


def task_prompter(processor, task: Environment, cell_px: int) -> ChatPrompter:
    """The chat prompter of the model's processor for one task: its instruction and as many image
    tokens as one of its pictures takes."""
    height, width = task.picture_size(cell_px)
    enc = processor.image_processor(images=[np.zeros((height, width, 3), np.uint8)], return_tensors="np")
    merge = getattr(processor.image_processor, "merge_size", 1)
    n_tokens = int(np.prod(enc["image_grid_thw"][0]) // (merge * merge))
    return ChatPrompter(processor.tokenizer, n_tokens, task.instruction)


def check_prompt_fits(prompters: dict[str, ChatPrompter], cfg: Config) -> None:
    """trainer.max_prompt_length bounds each task's first prompt (instruction and picture)."""
    limit = cfg.trainer.max_prompt_length
    for env_id, prompter in prompters.items():
        first, _ = prompter.prompt([""], [])
        if len(first) > limit:
            raise InputError(f"trainer.max_prompt_length: the first turn's prompt of {env_id} is {len(first)} tokens "
                             f"({prompter.n_image} of them the picture) but the limit is {limit}; raise it or "
                             f"lower environment.cell_px")

