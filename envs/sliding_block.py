"""VisGym's sliding-block puzzle (Klotski), its rules as VisGym states them: a 5x4 board of ten
blocks (one 2x2, one 1x2, four 2x1, four 1x1), each move slides one block one cell up, right, down
or left into empty cells. The target board is the solved layout shuffled by random moves; the agent
starts from the solved layout and must make the board match the target, then stop. The only reward
is 1.0 for `stop` with every block on its target cell; a move that is not possible leaves the board
as it is, with feedback. After `max_turns` turns the episode is truncated.

Answers: VisGym's `('move', (block_id, direction))` (0 up, 1 right, 2 down, 3 left) and
`('stop', 'stop')`, or `<action>3 up</action>` / `<action>stop</action>`; the last action in an
answer counts. The picture shows both boards side by side (target left, current right), each block
in its VisGym colour (red 2x2, green 1x2, blue 2x1, yellow 1x1) with its id drawn on it.
"""
from __future__ import annotations

import re
from collections import deque

import numpy as np
from gymnasium import spaces

from envs.base import StopToWinEnv

ROWS, COLS = 5, 4
SIZES = {1: (2, 2), 2: (1, 2), 3: (2, 1), 4: (2, 1), 5: (2, 1), 6: (2, 1), 7: (1, 1), 8: (1, 1), 9: (1, 1), 10: (1, 1)}
SOLVED = {1: (0, 1), 2: (2, 1), 3: (0, 0), 4: (0, 3), 5: (2, 0), 6: (2, 3), 7: (4, 0), 8: (4, 3), 9: (3, 1), 10: (3, 2)}
DIRECTIONS = ("up", "right", "down", "left")  # index = VisGym's direction code
STEPS = ((-1, 0), (0, 1), (1, 0), (0, -1))
COLOURS = {(2, 2): (220, 40, 40), (1, 2): (40, 170, 60), (2, 1): (50, 80, 220), (1, 1): (235, 200, 40)}

INVALID_ACTION = ("Invalid action. Answer with <action>BLOCK DIRECTION</action> (a block id 1-10 and up, right, "
                  "down or left), or <action>stop</action>.")

_TAG = re.compile(r"<action>\s*(?:(\d{1,2})\s+(up|right|down|left)|(stop))\s*</action>", re.IGNORECASE)
_TUPLE = re.compile(r"""\(\s*['"]move['"]\s*,\s*\(\s*(\d{1,2})\s*,\s*([0-3])\s*\)\s*\)"""
                    r"""|\(\s*['"]stop['"]\s*,\s*['"]stop['"]\s*\)""")

Positions = dict[int, tuple[int, int]]


def parse_move(answer) -> tuple[int, int] | str | None:
    """(block id, direction code), "stop", or None when the answer holds no well-formed action."""
    if not isinstance(answer, str):
        return None
    found = []
    for m in _TAG.finditer(answer):
        found.append((m.end(), "stop" if m.group(3) else (int(m.group(1)), DIRECTIONS.index(m.group(2).lower()))))
    for m in _TUPLE.finditer(answer):
        found.append((m.end(), "stop" if m.group(1) is None else (int(m.group(1)), int(m.group(2)))))
    return max(found)[1] if found else None


def board_of(positions: Positions) -> np.ndarray:
    board = np.zeros((ROWS, COLS), np.int8)
    for block, (r, c) in positions.items():
        h, w = SIZES[block]
        board[r:r + h, c:c + w] = block
    return board


def slide(positions: Positions, block: int, direction: int) -> Positions | None:
    """The positions after sliding `block` one cell in `direction`, or None where it cannot go."""
    if block not in positions:
        return None
    (r, c), (h, w), (dr, dc) = positions[block], SIZES[block], STEPS[direction]
    nr, nc = r + dr, c + dc
    if not (0 <= nr <= ROWS - h and 0 <= nc <= COLS - w):
        return None
    board = board_of(positions)
    window = board[nr:nr + h, nc:nc + w]
    if np.any((window != 0) & (window != block)):
        return None
    return {**positions, block: (nr, nc)}


def legal_moves(positions: Positions) -> list[tuple[int, int]]:
    return [(b, d) for b in sorted(positions) for d in range(4) if slide(positions, b, d) is not None]


def key(positions: Positions) -> tuple:
    return tuple(positions[b] for b in sorted(positions))


def shortest_moves(start: Positions, target: Positions) -> list[tuple[int, int]]:
    """The fewest moves from `start` to `target` (breadth-first over board layouts)."""
    goal, seen = key(target), {key(start)}
    queue = deque([(start, [])])
    while queue:
        positions, path = queue.popleft()
        if key(positions) == goal:
            return path
        for move in legal_moves(positions):
            nxt = slide(positions, *move)
            if key(nxt) not in seen:
                seen.add(key(nxt))
                queue.append((nxt, path + [move]))
    raise ValueError("the target layout cannot be reached")


def without_ids(positions: Positions) -> tuple:
    """The picture with the digits erased: which cells each size (so colour) of block covers."""
    return tuple(sorted((SIZES[b], p) for b, p in positions.items()))


def twin_boards(targets: list[Positions]) -> list[bool]:
    """For each target, whether another layout as few moves from the start looks the same with the
    ids erased: a policy that cannot read the digits plays a twin's moves as often as its own."""
    distance, looks = {key(SOLVED): 0}, {without_ids(SOLVED): [key(SOLVED)]}
    frontier, d = [SOLVED], 0
    # breadth first, a whole level at a time, until every target is reached: all layouts as near as
    # the farthest target are then known
    while any(key(t) not in distance for t in targets):
        if not frontier:
            raise ValueError("a target layout cannot be reached")
        d += 1
        nxt = []
        for positions in frontier:
            for move in legal_moves(positions):
                moved = slide(positions, *move)
                if key(moved) not in distance:
                    distance[key(moved)] = d
                    looks.setdefault(without_ids(moved), []).append(key(moved))
                    nxt.append(moved)
        frontier = nxt
    return [any(other != key(t) and distance[other] <= distance[key(t)] for other in looks[without_ids(t)])
            for t in targets]


def shuffled_target(rng: np.random.Generator, moves: int) -> Positions:
    """The solved layout after `moves` random moves, none undoing the one before it where another is
    possible, and not the solved layout itself."""
    while True:
        positions, last = dict(SOLVED), None
        for _ in range(moves):
            legal = legal_moves(positions)
            # no move straight back, unless it is the only one
            options = [m for m in legal if last is None or m != (last[0], (last[1] + 2) % 4)] or legal
            last = options[int(rng.integers(len(options)))]
            positions = slide(positions, *last)
        if key(positions) != key(SOLVED):
            return positions


class SlidingBlockEnv(StopToWinEnv):
    metadata = {"render_modes": ["rgb_array"]}
    invalid_feedback = INVALID_ACTION
    stopped_feedback = ("Stopped on the target layout.", "Stopped away from the target layout.")

    def __init__(self, shuffle_moves: int = 4, cell_px: int = 16, max_turns: int = 12):
        if shuffle_moves < 1 or cell_px < 8 or max_turns < 1:
            raise ValueError("shuffle_moves and max_turns must be >= 1 and cell_px >= 8")
        self.shuffle_moves, self.cell_px, self.max_turns = shuffle_moves, cell_px, max_turns
        self.observation_space = spaces.Box(0, 255, (ROWS * cell_px, (2 * COLS + 1) * cell_px, 3), np.uint8)
        self.positions = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        state = (options or {}).get("init_state")
        if state is not None:
            self.target = {int(b): tuple(p) for b, p in state["target"].items()}
            self.positions = {int(b): tuple(p) for b, p in state.get("current", SOLVED).items()}
        else:
            self.target, self.positions = shuffled_target(self.np_random, self.shuffle_moves), dict(SOLVED)
        self.turn, self.feedback = 0, ""
        return self.observation(), self.info(valid=True)

    # ---- the turn rules (envs.base.StopToWinEnv.step) ---------------------------------------
    def parse(self, answer):
        return parse_move(answer)

    def act(self, action: tuple[int, int]) -> str:
        block, direction = action
        moved = slide(self.positions, block, direction)
        if moved is None:
            return f"Block {block} cannot move {DIRECTIONS[direction]}."
        self.positions = moved
        return f"Moved block {block} {DIRECTIONS[direction]}."

    def at_goal(self) -> bool:
        return key(self.positions) == key(self.target)

    def started(self) -> bool:
        return self.positions is not None

    def observation(self):
        return self.render()

    def render(self):
        cell = self.cell_px
        image = np.full((ROWS * cell, (2 * COLS + 1) * cell, 3), 255, np.uint8)
        image[:, COLS * cell:(COLS + 1) * cell] = 128  # the gap between the two boards
        for left, positions in ((0, self.target), ((COLS + 1) * cell, self.positions)):
            for block, (r, c) in positions.items():
                h, w = SIZES[block]
                y, x = r * cell, left + c * cell
                image[y:y + h * cell, x:x + w * cell] = 0  # outline
                image[y + 1:y + h * cell - 1, x + 1:x + w * cell - 1] = COLOURS[(h, w)]
                _draw_number(image, block, y + (h * cell) // 2, x + (w * cell) // 2, cell)
        return image

    def get_state(self) -> dict:
        return {"target": {str(b): list(p) for b, p in self.target.items()},
                "current": {str(b): list(p) for b, p in self.positions.items()}}

    def info(self, valid: bool) -> dict:
        return {"positions": key(self.positions), "feedback": self.feedback, "valid_action": valid,
                "turn": self.turn, "solved": key(self.positions) == key(self.target),
                "placed": sum(self.positions[b] == self.target[b] for b in self.target)}


def block_ids(env: SlidingBlockEnv) -> np.ndarray:
    """Which block covers each cell of the picture (target board, gap, current board), as rows x
    (2 x columns + 1): 0 empty, -1 the gap column. A perception probe's labels."""
    cells = np.zeros((ROWS, 2 * COLS + 1), np.int64)
    cells[:, COLS] = -1
    for left, positions in ((0, env.target), (COLS + 1, env.positions)):
        for block, (r, c) in positions.items():
            h, w = SIZES[block]
            cells[r:r + h, left + c:left + c + w] = block
    return cells


# 3x5 glyphs of the digits, one string of 15 pixels a digit, read row by row
_GLYPHS = ["111101101101111", "010110010010111", "111001111100111", "111001111001111", "101101111001001",
           "111100111001111", "111100111101111", "111001001001001", "111101111101111", "111101111001111"]


def _draw_number(image: np.ndarray, number: int, cy: int, cx: int, cell: int) -> None:
    """`number` in black, centred on (cy, cx), each glyph pixel a square of cell // 8 pixels."""
    px = max(1, cell // 8)
    digits = [int(d) for d in str(number)]
    width = len(digits) * 3 * px + (len(digits) - 1) * px
    top, left = cy - (5 * px) // 2, cx - width // 2
    for k, d in enumerate(digits):
        glyph = np.array([int(b) for b in _GLYPHS[d]], bool).reshape(5, 3)
        block = np.kron(glyph, np.ones((px, px), bool))
        x = left + k * 4 * px
        region = image[top:top + 5 * px, x:x + 3 * px]
        region[block] = 0
