"""Environments by name: the built-in tasks, and a user's own by import path.

`environment.env_class` is a registered name (`maze_2d/easy`) or `package.module:Class`, a subclass
of envs.base.Environment importable where the run's actors run (ship it with the job's working
directory), or several of these joined by `+` (a mix of tasks in one run: envs/mix.py). `register`
adds a name for an instance, as the built-in tasks do below.
"""
from __future__ import annotations

import importlib

from envs.base import Environment
from envs.mix import SEPARATOR, TaskMix

_REGISTRY: dict[str, Environment] = {}


def register(environment: Environment) -> Environment:
    if not environment.name:
        raise ValueError(f"{type(environment).__name__} has no name")
    _REGISTRY[environment.name] = environment
    return environment


def names() -> list[str]:
    return sorted(_REGISTRY)


def get_environment(name: str) -> Environment:
    """The environment `environment.env_class` names; ValueError naming the known ones otherwise."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if SEPARATOR in name:
        return TaskMix(name, [get_environment(part) for part in name.split(SEPARATOR)])
    if ":" not in name:
        raise ValueError(f"unknown environment '{name}'; known: {', '.join(names())}, or an import path "
                         f"package.module:Class of an envs.base.Environment subclass, or several joined by "
                         f"'{SEPARATOR}' (a mix)")
    module, _, attr = name.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"environment '{name}' cannot be imported: {e}") from None
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ValueError(f"environment '{name}' is not a subclass of envs.base.Environment")
    environment = cls()
    environment.name = name  # rows and manifests name it as the config does
    return register(environment)


def _builtin() -> None:
    from envs.maze import MAZE_IDS
    from envs.maze_task import MazeTask
    from envs.sliding_block_task import SHUFFLES, SlidingBlockTask
    for env_id, (size, trail) in MAZE_IDS.items():
        register(MazeTask(env_id, size, trail))
    for env_id in SHUFFLES:
        register(SlidingBlockTask(env_id))


_builtin()
