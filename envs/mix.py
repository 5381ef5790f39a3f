"""Several tasks in one run: `environment.env_class=maze_2d/easy+sliding_block/easy`.

A mix holds its parts' rows as they are (each keeps its part's `env_id`), so each episode is its
row's task throughout: the env pool makes the part's env (EnvPool.reset takes each episode's
env_id), the rollout prompts with the part's instruction and picture size (one prompter a part),
and the evaluation reports each part beside the whole. The sampler, the advantages and the trainer
see rows and episodes, never the task.

Its dataset is the parts' datasets, each of `size / parts` rows from the config's seed ranges: a
mix of two tasks with `data.eval_size=128` evaluates each on the same 64 rows a run of that task
alone does. Train rows alternate between the parts, so every batch holds both.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from envs.base import Environment
from envs.rows import load_rows, write_splits

SEPARATOR = "+"


class TaskMix(Environment):
    def __init__(self, name: str, parts: list[Environment]):
        if len(parts) < 2 or len({p.name for p in parts}) < len(parts):
            raise ValueError(f"environment '{name}' must name two or more different environments")
        self.name, self._parts = name, {p.name: p for p in parts}

    def parts(self) -> list[Environment]:
        return list(self._parts.values())

    def part(self, env_id: str) -> Environment:
        if env_id not in self._parts:
            raise ValueError(f"a {env_id} row, but environment '{self.name}' holds {', '.join(self._parts)}")
        return self._parts[env_id]

    def picture_size(self, cell_px: int) -> tuple[int, int]:
        raise ValueError(f"environment '{self.name}' has one picture size a part: ask each of parts()")

    def make_env(self, cell_px: int, max_turns: int):
        raise ValueError(f"environment '{self.name}' has no env of its own: each episode plays its row's part")

    def check_row(self, row: dict) -> None:
        self.part(row["env_id"]).check_row(row)

    def make_rows(self, seed_start: int, count: int, max_turns: int, solvable_only: bool = True) -> list[dict]:
        per_part = [p.make_rows(seed_start, n, max_turns, solvable_only) for p, n in zip(self.parts(), self._shares(count))]
        return interleave(per_part)

    def write_dataset(self, folder: Path, data, max_turns: int) -> dict:
        """Each part writes its share under parts/<k>/; the mix's files join them (train interleaved,
        eval and validation one part after the other) under one manifest that names the parts'."""
        splits = {"train": data.train_size, "eval": data.eval_size, "validation": data.validation_size}
        shares = {name: self._shares(size) for name, size in splits.items()}
        manifests, rows = {}, {name: [] for name in splits}
        for k, part in enumerate(self.parts()):
            sub = dataclasses.replace(data, **{f"{name}_size": shares[name][k] for name in splits})
            manifests[part.name] = part.write_dataset(folder / "parts" / str(k), sub, max_turns)
            for name in splits:
                if name in manifests[part.name]["splits"]:
                    rows[name].append(load_rows(folder / "parts" / str(k) / f"{name}.jsonl"))
        first = next(iter(manifests.values()))
        manifest = {"env_id": self.name, "max_turns": max_turns, "parts": manifests, "splits": {},
                    "filter": {"solvable_only": data.solvable_only,
                               "train_long_route_share": first["filter"].get("train_long_route_share"),
                               "train_junction_start_share": first["filter"].get("train_junction_start_share", 0.0),
                               "train_detour_start_share": first["filter"].get("train_detour_start_share", 0.0)}}
        written = []
        for name, per_part in rows.items():
            if per_part:
                seeds = [m["splits"][name]["seed_range"] for m in manifests.values()]
                start, end = min(s[0] for s in seeds), max(s[1] for s in seeds)
                joined = interleave(per_part) if name == "train" else [r for part in per_part for r in part]
                written.append((name, joined, start, end - start))
        return write_splits(folder, manifest, written)

    def _shares(self, count: int) -> list[int]:
        n = len(self._parts)
        return [count // n + (k < count % n) for k in range(n)]

    def expert_turns(self, row: dict) -> int | None:
        return self.part(row["env_id"]).expert_turns(row)

    def is_hard(self, row: dict) -> bool:
        return self.part(row["env_id"]).is_hard(row)

    def describe(self, row: dict) -> dict:
        return self.part(row["env_id"]).describe(row)


def env_class_of(env_ids) -> str:
    """The environment.env_class that holds rows of these tasks: the task, or their mix in order of appearance."""
    return SEPARATOR.join(dict.fromkeys(env_ids))


def interleave(lists: list[list[dict]]) -> list[dict]:
    """a0, b0, a1, b1, ...; a longer list's rest at the end."""
    out = []
    for k in range(max(map(len, lists))):
        out += [rows[k] for rows in lists if k < len(rows)]
    return out
