"""Train and eval sets of mazes, written with a manifest so a run can prove what it saw.

Each row is one maze: seed, env id, layout, start, goal and the optimal move count. Rows come
from disjoint seed ranges (train from `train_seed_start`, eval from `eval_seed_start`, and an
optional validation split, which chooses the run's best adapter, from `validation_seed_start`),
and the same arguments always give byte-identical files. With `solvable_only`, a seed is kept
only when the BFS expert finishes within `max_turns` turns (its moves plus the final stop); the
manifest records the filter and how many seeds it skipped. With `junction_start_share`, that
share of the train mazes starts at a junction of its route instead of the corner (a curriculum:
see `start_at_junctions`); with `detour_start_share`, that share starts inside a wrong branch with
the walk there behind it as trail (see `start_in_detours`).
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from envs.expert import junctions, shortest_path
from envs.generate import DELTAS
from envs.maze import MAZE_IDS, MazeEnv
from envs.rows import seed_splits, write_splits


def shortest_route(env_id: str) -> int:
    """The fewest moves any maze of the env needs: start and goal are opposite inner corners."""
    return 2 * (MAZE_IDS[env_id][0] - 3)


def make_rows(env_id: str, seed_start: int, count: int, max_turns: int, solvable_only: bool,
              seed_limit: int | None = None, long_route_share: float | None = None):
    """Return (rows, seeds scanned). Seeds are scanned upwards from seed_start. With
    long_route_share, that share of the rows (rounded) has a route longer than the env's shortest
    and the rest the shortest; a seed whose kind is already full is skipped."""
    shortest = shortest_route(env_id)
    if solvable_only and shortest + 1 > max_turns:
        raise ValueError(f"no {env_id} maze is solvable within max_turns={max_turns}: every route needs at least "
                         f"{shortest} moves plus the stop; raise generator.max_turns or set data.solvable_only=false")
    env = MazeEnv(size=MAZE_IDS[env_id][0], cell_px=4, max_turns=max_turns)
    rows, seed = [], seed_start
    room = None if long_route_share is None else {True: round(long_route_share * count)}
    if room is not None:
        room[False] = count - room[True]
    while len(rows) < count:
        if seed_limit is not None and seed >= seed_limit:
            raise ValueError(f"seed range [{seed_start}, {seed_limit}) holds only {len(rows)} "
                             f"usable mazes, {count} asked for; move the eval seed range further away")
        env.reset(seed=seed)
        moves = env.optimal_moves()
        kind = moves > shortest
        if (not solvable_only or moves + 1 <= max_turns) and (room is None or room[kind] > 0):
            if room is not None:
                room[kind] -= 1
            rows.append({"seed": seed, "env_id": env_id, "maze": env.maze.tolist(),
                         "start": list(env.agent), "goal": list(env.target), "optimal_moves": moves})
        seed += 1
    return rows, seed - seed_start


@functools.lru_cache(maxsize=16)
def env_ceiling(env_id: str, max_turns: int, seeds: int = 2000) -> float:
    """The BFS expert's solve rate on random mazes of the env (seeds 0..seeds-1, no filter) within
    max_turns: what a perfect agent reaches before any dataset filter (1.0 on a filtered set)."""
    rows, _ = make_rows(env_id, 0, seeds, max_turns, solvable_only=False)
    return sum(r["optimal_moves"] + 1 <= max_turns for r in rows) / seeds


def start_at_junctions(rows: list[dict], share: float, seed: int) -> list[dict]:
    """The rows with a share of them (rounded, chosen by `seed`) starting at a junction of their
    optimal route: a route cell other than its ends with a third open neighbour, where a wrong turn
    is possible. Such an episode begins with a branch decision and no history, as turn 1 at the
    corner does, where the long mazes are lost. A route without a junction keeps its corner."""
    rng = np.random.default_rng(seed)
    chosen = set(rng.choice(len(rows), round(share * len(rows)), replace=False).tolist())
    out = []
    for i, row in enumerate(rows):
        if i in chosen:
            maze = np.asarray(row["maze"])
            route = shortest_path(maze, row["start"], row["goal"])
            branching = junctions(maze)
            on_route = [c for c in route[1:-1] if branching[c]]
            if on_route:
                cell = on_route[int(rng.integers(len(on_route)))]
                row = {**row, "start": list(cell), "optimal_moves": len(route) - 1 - route.index(cell)}
        out.append(row)
    return out


def start_in_detours(rows: list[dict], share: float, seed: int, max_turns: int) -> list[dict]:
    """The rows with a share of them (rounded, chosen by `seed`) starting inside a wrong branch: the
    agent has walked the route to a fork (a route cell, the start included, with an open neighbour
    off the route), turned off it and gone on into the branch, never back, to a random depth, as far
    as its dead end. The cells walked are the row's `trail`, drawn as cells left. This is where the
    hard mazes' held-out failures sit (an early detour, then pushes at the dead end's walls), a state
    the sampler seldom reaches, so seldom trains on. A row whose route has no fork, or whose detour
    leaves no solution within max_turns, keeps its start."""
    rng = np.random.default_rng(seed)
    chosen = set(rng.choice(len(rows), round(share * len(rows)), replace=False).tolist())
    out = []
    for i, row in enumerate(rows):
        if i in chosen:
            row = _detour(row, rng, max_turns) or row
        out.append(row)
    return out


def _detour(row: dict, rng, max_turns: int) -> dict | None:
    maze = np.asarray(row["maze"])
    route = shortest_path(maze, row["start"], row["goal"])
    on_route = set(route)

    def open_cells(cell, exclude):
        return [n for n in ((cell[0] + dr, cell[1] + dc) for dr, dc in DELTAS) if maze[n] == 0 and n not in exclude]

    forks = [(k, off) for k, cell in enumerate(route[:-1]) for off in open_cells(cell, on_route)]
    if not forks:
        return None
    k, cell = forks[int(rng.integers(len(forks)))]
    walk = [cell]  # the maze is a tree: descending never meets a walked cell again
    while nxt := open_cells(walk[-1], on_route | set(walk)):
        walk.append(nxt[int(rng.integers(len(nxt)))])
    walk = walk[:1 + int(rng.integers(len(walk)))]
    path = route[:k + 1] + walk
    moves = len(shortest_path(maze, path[-1], row["goal"])) - 1
    if moves + 1 > max_turns:
        return None
    return {**row, "start": list(path[-1]), "optimal_moves": moves, "trail": [list(c) for c in path[:-1]]}


def write_dataset(out_dir, env_id: str, train_size: int, eval_size: int, train_seed_start: int,
                  eval_seed_start: int, max_turns: int, solvable_only: bool, validation_size: int = 0,
                  validation_seed_start: int = 0, long_route_share: float | None = None,
                  junction_start_share: float = 0.0, detour_start_share: float = 0.0) -> dict:
    def make(split: str, start: int, count: int, seed_limit: int | None):
        if split != "train":  # the eval and validation sets keep the env's own mix and corners
            return make_rows(env_id, start, count, max_turns, solvable_only, seed_limit)
        rows, scanned = make_rows(env_id, start, count, max_turns, solvable_only, seed_limit, long_route_share)
        if junction_start_share:
            rows = start_at_junctions(rows, junction_start_share, start)
        if detour_start_share:
            rows = start_in_detours(rows, detour_start_share, start + 1, max_turns)
        return rows, scanned

    out = Path(out_dir)
    splits = seed_splits(make, train_size, eval_size, train_seed_start, eval_seed_start, validation_size,
                         validation_seed_start)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"env_id": env_id, "max_turns": max_turns,
                "filter": {"solvable_only": solvable_only,
                           "rule": "BFS optimal moves + 1 stop <= max_turns" if solvable_only else None,
                           "train_long_route_share": long_route_share,
                           "train_junction_start_share": junction_start_share,
                           "train_detour_start_share": detour_start_share},
                "splits": {}}
    return write_splits(out, manifest, splits)


def init_state(row: dict) -> dict:
    """What MazeEnv.reset(options={"init_state": ...}) needs to rebuild this row's maze; a detour
    start's trail becomes the cells left, each first entered from the one before it."""
    trail = row.get("trail", [])
    walked = trail + [row["start"]]
    return {"maze": row["maze"], "agent": row["start"], "target": row["goal"], "turn": 0, "left": trail,
            "came_from": [[*cell, *before] for before, cell in zip(walked, walked[1:])]}
