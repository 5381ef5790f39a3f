"""The tasks: the environment interface (base.py) and registry, VisGym's maze and sliding-block
puzzle with their experts, action parser, pictures and datasets, and mixes of tasks."""
import gymnasium as gym

from envs.maze import MAZE_IDS, SIZES, MazeEnv

for _env_id, (_size, _trail) in MAZE_IDS.items():
    if _env_id not in gym.registry:
        gym.register(id=_env_id, entry_point="envs.maze:MazeEnv", kwargs={"size": _size, "trail": _trail})

__all__ = ["MazeEnv", "SIZES"]
