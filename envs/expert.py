"""The BFS expert: the optimal route and the action sequence that walks it."""
from __future__ import annotations

from collections import deque

import numpy as np

from envs.actions import MOVES
from envs.generate import DELTAS


def shortest_path(maze: np.ndarray, start, goal) -> list[tuple[int, int]]:
    """Cells from start to goal inclusive; empty when the goal cannot be reached."""
    start, goal = tuple(int(v) for v in start), tuple(int(v) for v in goal)
    parent = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            path = []
            while cell is not None:
                path.append(cell)
                cell = parent[cell]
            return path[::-1]
        for dr, dc in DELTAS:
            nxt = (cell[0] + dr, cell[1] + dc)
            if (0 <= nxt[0] < maze.shape[0] and 0 <= nxt[1] < maze.shape[1]
                    and maze[nxt] == 0 and nxt not in parent):
                parent[nxt] = cell
                queue.append(nxt)
    return []


def expert_actions(maze: np.ndarray, start, goal) -> list[str]:
    """Optimal moves by name, ending with "stop"."""
    path = shortest_path(maze, start, goal)
    if not path:
        raise ValueError(f"goal {tuple(goal)} is unreachable from {tuple(start)}")
    moves = [MOVES[DELTAS.index((b[0] - a[0], b[1] - a[1]))] for a, b in zip(path, path[1:])]
    return moves + ["stop"]


def optimal_moves(maze: np.ndarray, start, goal) -> int:
    return len(shortest_path(maze, start, goal)) - 1


def branch_size(maze: np.ndarray, junction, entry) -> int:
    """Open cells reachable from `entry` without passing through `junction` (its neighbour): how far
    a wrong turn at the junction can lead before the agent must come back. 0 when entry is a wall."""
    junction, entry = tuple(int(v) for v in junction), tuple(int(v) for v in entry)
    if maze[entry] != 0:
        return 0
    seen = {junction, entry}
    queue = deque([entry])
    while queue:
        cell = queue.popleft()
        for dr, dc in DELTAS:
            nxt = (cell[0] + dr, cell[1] + dc)
            if maze[nxt] == 0 and nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return len(seen) - 1


def junctions(maze: np.ndarray) -> np.ndarray:
    """The floor cells with three or more open neighbours: where a wrong branch can be taken."""
    floor = np.pad(maze == 0, 1)
    neighbours = floor[:-2, 1:-1].astype(int) + floor[2:, 1:-1] + floor[1:-1, :-2] + floor[1:-1, 2:]
    return (maze == 0) & (neighbours >= 3)


def goal_fields(maze: np.ndarray, goal) -> tuple[np.ndarray, np.ndarray]:
    """For every floor cell, the expert's action there (index into ACTIONS: a move toward the goal,
    4 = stop on the goal) and its distance in moves to the goal; -1 on walls. One BFS from the goal."""
    field = np.full(maze.shape, -1, dtype=np.int64)
    distance = np.full(maze.shape, -1, dtype=np.int64)
    goal = tuple(int(v) for v in goal)
    field[goal], distance[goal] = 4, 0
    queue = deque([goal])
    while queue:
        cell = queue.popleft()
        for d, (dr, dc) in enumerate(DELTAS):
            nxt = (cell[0] + dr, cell[1] + dc)
            if maze[nxt] == 0 and field[nxt] == -1:
                field[nxt] = (d + 2) % 4  # from nxt, the move back toward cell
                distance[nxt] = distance[cell] + 1
                queue.append(nxt)
    return field, distance


def direction_field(maze: np.ndarray, goal) -> np.ndarray:
    """goal_fields' expert action for every floor cell, -1 on walls."""
    return goal_fields(maze, goal)[0]
