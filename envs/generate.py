"""Perfect mazes from Wilson's loop-erased random walk (the generator VisGym's maze_2d uses).

The grid is `size` x `size` with an outer wall ring; rooms sit at odd coordinates and the cells
between two rooms are carved when the walk passes. 1 = wall, 0 = floor.
"""
from __future__ import annotations

import numpy as np

# Index = VisGym's direction code: 0 right, 1 up, 2 left, 3 down. (row, col) deltas.
DELTAS = ((0, 1), (-1, 0), (0, -1), (1, 0))


def wilson_maze(size: int, rng: np.random.Generator) -> np.ndarray:
    if size < 5 or size % 2 == 0:
        raise ValueError(f"maze size must be odd and >= 5, got {size}")
    rooms = (size - 1) // 2
    grid = np.ones((size, size), dtype=np.int8)
    in_tree = np.zeros((rooms, rooms), dtype=bool)

    def carve(room):
        grid[2 * room[0] + 1, 2 * room[1] + 1] = 0

    first = divmod(int(rng.integers(rooms * rooms)), rooms)
    in_tree[first] = True
    carve(first)
    for flat in rng.permutation(rooms * rooms):
        start = divmod(int(flat), rooms)
        if in_tree[start]:
            continue
        # Random walk until the tree is hit; remembering only the last exit of each room
        # erases the loops.
        exit_of = {}
        room = start
        while not in_tree[room]:
            options = [d for d, (dr, dc) in enumerate(DELTAS)
                       if 0 <= room[0] + dr < rooms and 0 <= room[1] + dc < rooms]
            d = options[int(rng.integers(len(options)))]
            exit_of[room] = d
            room = (room[0] + DELTAS[d][0], room[1] + DELTAS[d][1])
        room = start
        while not in_tree[room]:
            in_tree[room] = True
            carve(room)
            dr, dc = DELTAS[exit_of[room]]
            grid[2 * room[0] + 1 + dr, 2 * room[1] + 1 + dc] = 0
            room = (room[0] + dr, room[1] + dc)
    return grid


def corner_pair(size: int, rng: np.random.Generator) -> tuple[tuple[int, int], tuple[int, int]]:
    """Start and goal at opposite inner corners, one of the four pairings at random."""
    lo, hi = 1, size - 2
    pairs = (((lo, lo), (hi, hi)), ((hi, hi), (lo, lo)), ((hi, lo), (lo, hi)), ((lo, hi), (hi, lo)))
    return pairs[int(rng.integers(len(pairs)))]
