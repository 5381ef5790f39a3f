"""The visual maze environment, compatible with VisGym's maze_2d.

One action a turn. A move into a wall leaves the agent where it is ("Cannot move into a wall.");
an answer that holds no valid action uses up the turn with feedback and reward 0. The only
reward is 1.0 for `stop` on the goal; `stop` anywhere else ends the episode with 0. After
`max_turns` turns the episode is truncated.

visrl's trail variants (`maze_2d/easy_trail`, `maze_2d/hard_trail`): the same mazes, rules and
reward; in the picture every cell the agent has left is tinted and every wall it has run into is
darkened, so one picture shows where the agent has been and what it has tried. Without the tint a
greedy agent that steps into a side branch can pace between two cells until its turns run out;
without the dark wall a wall hit leaves the picture as it was, and a greedy agent answers the same
move again until its turns run out.

The marks variants (`maze_2d/easy_marks`, `maze_2d/hard_marks`) also paint a cell green once the
agent has walked back out of it, toward the cell it first came into it from. The maze is a tree, so
those are the cells of branches given up, while the way from the start stays tinted: Tremaux's rule
(an untinted cell first, else a tinted one, a green one last) becomes something a policy that reads
only the picture can follow, and it explores the whole maze without pacing. With the single tint,
every cell around an agent that has walked back looks the same, and a greedy agent paces between two
of them (tests/test_maze_env.py plays the rule on both pictures).
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces

from envs.actions import ACTIONS, MOVES, parse_action
from envs.base import StopToWinEnv
from envs.expert import optimal_moves
from envs.generate import DELTAS, corner_pair, wilson_maze
from envs.render import BUMP_RGB, MARK_RGB, TRAIL_RGB, draw_agent, paint_cell, render_background, render_text

SIZES = {"maze_2d/easy": 9, "maze_2d/hard": 11}
TRAILS = {"": 0, "_trail": 1, "_marks": 2}  # id suffix -> trail level (MazeEnv's `trail`)
MAZE_IDS = {env_id + suffix: (size, trail) for env_id, size in SIZES.items()
            for suffix, trail in TRAILS.items()}  # env id -> (size, trail level)

INVALID_ACTION = ("Invalid action. Answer with one of <action>right</action>, <action>up</action>, "
                  "<action>left</action>, <action>down</action> or <action>stop</action>.")
WALL_HIT = "Cannot move into a wall."


class MazeEnv(StopToWinEnv):
    metadata = {"render_modes": ["rgb_array", "ansi"]}
    invalid_feedback = INVALID_ACTION

    def __init__(self, size: int = 9, cell_px: int = 32, max_turns: int = 15,
                 render_mode: str = "rgb_array", trail: int = 0):
        """trail: 0 VisGym's picture; 1 cells left tinted and walls hit darkened; 2 also the cells
        walked back out of in green."""
        if size < 5 or size % 2 == 0:
            raise ValueError(f"maze size must be odd and >= 5, got {size}")
        if cell_px < 4:
            raise ValueError(f"cell_px must be >= 4, got {cell_px}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}")
        self.size, self.cell_px, self.max_turns, self.render_mode = size, cell_px, max_turns, render_mode
        if trail not in (0, 1, 2):
            raise ValueError(f"trail must be 0, 1 or 2, got {trail!r}")
        self.trail = int(trail)
        side = size * cell_px
        self.observation_space = spaces.Box(0, 255, (side, side, 3), dtype=np.uint8)
        # Also accepted by step(): model text, VisGym tuples and action names (see envs.actions).
        self.action_space = spaces.Discrete(len(ACTIONS))
        self.maze = None

    # ---- gymnasium API -------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        state = (options or {}).get("init_state")
        if state is not None:
            self._load_state(state)
        else:
            self.maze = wilson_maze(self.size, self.np_random)
            self.agent, self.target = corner_pair(self.size, self.np_random)
            self.turn, self.left, self.retreated, self.bumped, self.came_from = 0, [], [], [], {}
        # the route the episode started with: its progress is measured against it (a state rebuilt
        # mid-episode carries it; a row's init_state is the start)
        self.start_moves = int(state["start_moves"]) if state and "start_moves" in state else self.optimal_moves()
        self._background = render_background(self.maze, self.target, self.cell_px)
        for cell in self.left:
            self._tint(cell, TRAIL_RGB)
        for cell in self.retreated:
            self._tint(cell, MARK_RGB, level=2)
        for wall in self.bumped:
            self._tint(wall, BUMP_RGB)
        self.feedback = ""
        return self.observation(), self.info(valid=True)

    # ---- the turn rules (envs.base.StopToWinEnv.step) ---------------------------------------
    def parse(self, action):
        if isinstance(action, (int, np.integer)) and not isinstance(action, bool):
            action = ACTIONS[action] if 0 <= action < len(ACTIONS) else None
        return parse_action(action) if action is not None else None

    def act(self, name: str) -> str:
        dr, dc = DELTAS[MOVES.index(name)]
        nxt = (self.agent[0] + dr, self.agent[1] + dc)
        if self.maze[nxt] == 1:  # the outer ring is wall, so nxt never leaves the grid
            if nxt not in self.bumped:
                self.bumped.append(nxt)
                self._tint(nxt, BUMP_RGB)
            return WALL_HIT
        if self.agent not in self.left:
            self.left.append(self.agent)
            self._tint(self.agent, TRAIL_RGB)
        if nxt == self.came_from.get(self.agent) and self.agent not in self.retreated:
            self.retreated.append(self.agent)
            self._tint(self.agent, MARK_RGB, level=2)
        if nxt not in self.came_from and nxt not in self.left:  # a first visit (the start has no entry)
            self.came_from[nxt] = self.agent
        self.agent = nxt
        return f"Moved {name}."

    def _tint(self, cell, colour, level: int = 1) -> None:
        if self.trail >= level and tuple(cell) != tuple(self.target):  # the goal stays red
            paint_cell(self._background, cell, self.cell_px, colour)

    def at_goal(self) -> bool:
        return self.agent == self.target

    def started(self) -> bool:
        return self.maze is not None

    def render(self):
        if self.render_mode == "ansi":
            return render_text(self.maze, self.agent, self.target)
        return draw_agent(self._background, self.agent, self.cell_px)

    # ---- state ---------------------------------------------------------------------------
    def get_state(self) -> dict:
        """Everything needed to rebuild this moment: reset(options={"init_state": state})."""
        return {"maze": self.maze.tolist(), "agent": list(self.agent), "target": list(self.target),
                "turn": self.turn, "left": [list(cell) for cell in self.left],
                "retreated": [list(cell) for cell in self.retreated],
                "came_from": [[*cell, *parent] for cell, parent in self.came_from.items()],
                "bumped": [list(cell) for cell in self.bumped], "start_moves": self.start_moves}

    def _load_state(self, state: dict):
        maze = np.asarray(state["maze"], dtype=np.int8)
        if maze.shape != (self.size, self.size):
            raise ValueError(f"init_state maze is {maze.shape}, this env is {self.size}x{self.size}")
        self.maze = maze
        self.agent = tuple(int(v) for v in state["agent"])
        self.target = tuple(int(v) for v in state["target"])
        self.turn = int(state.get("turn", 0))
        self.left = [tuple(int(v) for v in cell) for cell in state.get("left", [])]
        self.retreated = [tuple(int(v) for v in cell) for cell in state.get("retreated", [])]
        self.came_from = {(int(r), int(c)): (int(pr), int(pc)) for r, c, pr, pc in state.get("came_from", [])}
        self.bumped = [tuple(int(v) for v in cell) for cell in state.get("bumped", [])]

    def observation(self):
        return draw_agent(self._background, self.agent, self.cell_px)

    def info(self, valid: bool) -> dict:
        return {"agent": self.agent, "target": self.target,
                "distance": abs(self.agent[0] - self.target[0]) + abs(self.agent[1] - self.target[1]),
                "feedback": self.feedback, "valid_action": valid, "turn": self.turn,
                "moves_left": self.optimal_moves(), "start_moves": self.start_moves}

    def optimal_moves(self) -> int:
        return optimal_moves(self.maze, self.agent, self.target)
