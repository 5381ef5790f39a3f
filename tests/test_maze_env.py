"""The maze: perfect mazes, VisGym's layout and colours, the rules of a turn, the BFS expert."""
from collections import deque

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs  # noqa: F401  (registers maze_2d/easy, maze_2d/hard and their trail and marks variants)
from envs.actions import ACTIONS, MOVES
from envs.expert import branch_size, expert_actions, optimal_moves
from envs.generate import DELTAS
from envs.maze import INVALID_ACTION, WALL_HIT, MazeEnv
from envs.render import AGENT_RGB, BUMP_RGB, FLOOR_RGB, GOAL_RGB, TRAIL_RGB, WALL_RGB

seeds = st.integers(min_value=0, max_value=2**31 - 1)
sizes = st.sampled_from([9, 11])


def floor_graph(maze):
    cells = {tuple(c) for c in np.argwhere(maze == 0)}
    edges = set()
    for r, c in cells:
        for dr, dc in DELTAS:
            if (r + dr, c + dc) in cells:
                edges.add(frozenset({(r, c), (r + dr, c + dc)}))
    return cells, edges


@settings(max_examples=150, deadline=None)
@given(seed=seeds, size=sizes)
def test_every_maze_is_perfect_with_opposite_corners(seed, size):
    env = MazeEnv(size=size)
    env.reset(seed=seed)
    maze = env.maze
    assert maze.shape == (size, size)
    assert maze[0].all() and maze[-1].all() and maze[:, 0].all() and maze[:, -1].all()
    cells, edges = floor_graph(maze)
    # connected ...
    seen, queue = {env.agent}, deque([env.agent])
    while queue:
        r, c = queue.popleft()
        for dr, dc in DELTAS:
            n = (r + dr, c + dc)
            if n in cells and n not in seen:
                seen.add(n)
                queue.append(n)
    assert seen == cells
    # ... and acyclic: a connected graph is a tree exactly when |E| = |V| - 1
    assert len(edges) == len(cells) - 1
    lo, hi = 1, size - 2
    assert {env.agent, env.target} in ({(lo, lo), (hi, hi)}, {(hi, lo), (lo, hi)})


@settings(max_examples=150, deadline=None)
@given(seed=seeds, size=sizes)
def test_expert_reaches_goal_optimally_and_is_rewarded_once(seed, size):
    env = MazeEnv(size=size, max_turns=200)
    env.reset(seed=seed)
    actions = expert_actions(env.maze, env.agent, env.target)
    assert len(actions) - 1 == optimal_moves(env.maze, env.agent, env.target)
    # Manhattan distance is a lower bound for the optimal route
    assert len(actions) - 1 >= abs(env.agent[0] - env.target[0]) + abs(env.agent[1] - env.target[1])
    rewards = []
    for i, a in enumerate(actions):
        _, reward, terminated, truncated, info = env.step(f"<action>{a}</action>")
        rewards.append(reward)
        assert terminated == (i == len(actions) - 1)
        assert not truncated
    assert rewards.count(1.0) == 1 and rewards[-1] == 1.0 and sum(rewards) == 1.0
    assert info["agent"] == info["target"] and info["distance"] == 0


@settings(max_examples=100, deadline=None)
@given(seed=seeds, moves=st.lists(st.sampled_from(MOVES), min_size=1, max_size=60))
def test_no_action_enters_a_wall_or_leaves_the_grid(seed, moves):
    env = MazeEnv(size=9, max_turns=100)
    env.reset(seed=seed)
    for m in moves:
        before = env.agent
        _, _, _, _, info = env.step(m)
        r, c = info["agent"]
        assert 0 <= r < 9 and 0 <= c < 9 and env.maze[r, c] == 0
        dr, dc = DELTAS[MOVES.index(m)]
        blocked = env.maze[before[0] + dr, before[1] + dc] == 1
        assert info["agent"] == (before if blocked else (before[0] + dr, before[1] + dc))
        assert (info["feedback"] == WALL_HIT) == blocked


def test_same_seed_same_maze_and_init_state_rebuilds_it():
    a, b = MazeEnv(), MazeEnv()
    a.reset(seed=7)
    b.reset(seed=7)
    assert np.array_equal(a.maze, b.maze) and a.agent == b.agent and a.target == b.target
    a.step("down"), a.step("right")
    state = a.get_state()
    c = MazeEnv()
    image, info = c.reset(options={"init_state": state})
    assert np.array_equal(image, a.render()) and info["agent"] == a.agent and c.turn == a.turn
    different = MazeEnv()
    different.reset(seed=8)
    assert not np.array_equal(different.maze, a.maze)


def test_rendering_colours_at_agent_goal_and_wall():
    px = 25  # VisGym's cell size: 225 x 225 for easy
    env = MazeEnv(size=9, cell_px=px)
    image, info = env.reset(seed=3)
    assert image.shape == (225, 225, 3) and image.dtype == np.uint8

    def centre(cell):
        return tuple(image[cell[0] * px + px // 2, cell[1] * px + px // 2])

    def corner(cell):  # the disc does not reach a cell's corner
        return tuple(image[cell[0] * px + 1, cell[1] * px + 1])

    assert centre(info["agent"]) == AGENT_RGB and corner(info["agent"]) == FLOOR_RGB
    assert centre(info["target"]) == GOAL_RGB
    assert centre((0, 0)) == WALL_RGB
    wall = tuple(np.argwhere(env.maze == 1)[5])
    assert centre(wall) == WALL_RGB
    # the agent on the goal: blue disc on the red square
    for a in expert_actions(env.maze, env.agent, env.target)[:-1]:
        image, *_ = env.step(a)
    assert centre(env.target) == AGENT_RGB and corner(env.target) == GOAL_RGB
    assert (image == np.array(AGENT_RGB)).all(-1).sum() > 0


def test_invalid_actions_use_the_turn_and_truncation_at_max_turns():
    env = MazeEnv(max_turns=3)
    env.reset(seed=1)
    start = env.agent
    _, r, term, trunc, info = env.step("I think I will go north")
    assert (r, term, trunc, info["feedback"], info["valid_action"]) == (0.0, False, False, INVALID_ACTION, False)
    assert env.agent == start and env.turn == 1
    env.step("")
    _, r, term, trunc, _ = env.step(None)
    assert (r, term, trunc) == (0.0, False, True)


def test_stop_away_from_goal_ends_with_zero():
    env = MazeEnv()
    env.reset(seed=2)
    _, r, term, trunc, info = env.step("('stop', 'stop')")
    assert (r, term, trunc) == (0.0, True, False) and "away" in info["feedback"]


def test_registered_ids_and_text_rendering():
    easy = gym.make("maze_2d/easy").unwrapped
    hard = gym.make("maze_2d/hard").unwrapped
    easy.reset(seed=0)
    hard.reset(seed=0)
    assert easy.maze.shape == (9, 9) and hard.maze.shape == (11, 11)
    text = MazeEnv(render_mode="ansi")
    text.reset(seed=0)
    rows = text.render().splitlines()
    assert len(rows) == 9 and rows[0] == "#" * 9
    assert rows[text.agent[0]][text.agent[1]] == "A" and rows[text.target[0]][text.target[1]] == "T"


def test_integer_actions_follow_visgym_codes():
    env = MazeEnv()
    env.reset(seed=4)
    for code, name in enumerate(ACTIONS[:4]):
        assert MOVES[code] == name
    with pytest.raises(ValueError):
        MazeEnv(size=8)


def text_maze(lines):
    return np.array([[1 if ch == "#" else 0 for ch in line] for line in lines], dtype=np.int8)


def dead_end_maze():
    """Eval maze 1,000,049: from the top-left corner, right leads into a 6-cell dead end, down to the goal."""
    return text_maze(["#########",
                      "#       #",
                      "# #######",
                      "#   #   #",
                      "# # # # #",
                      "# #   # #",
                      "# ### # #",
                      "#   # # #",
                      "#########"])


def test_branch_size_counts_the_dead_end_a_wrong_turn_enters():
    maze = dead_end_maze()
    assert branch_size(maze, (1, 1), (1, 2)) == 6
    assert branch_size(maze, (1, 1), (0, 1)) == 0  # a wall
    floor = int((maze == 0).sum())
    assert branch_size(maze, (1, 1), (2, 1)) == floor - 1 - 6
    assert branch_size(maze, (1, 4), (1, 5)) == 3  # deeper in, less of the dead end is left


def test_progress_is_the_share_of_the_starting_route_behind_the_agent():
    from envs.registry import get_environment
    task = get_environment("maze_2d/hard_trail")
    maze = dead_end_maze()
    env = MazeEnv(size=9, trail=1)
    _, info = env.reset(options={"init_state": {"maze": maze.tolist(), "agent": [1, 1], "target": [7, 7]}})
    start = optimal_moves(maze, (1, 1), (7, 7))
    assert task.progress(info) == 0.0 and info["start_moves"] == start
    progress = [task.progress(env.step(move)[4]) for move in ("right", "right", "left", "left", "down")]
    # into the dead end and back out: ground lost a move at a time, regained the same way
    assert progress == pytest.approx([-1 / start, -2 / start, -1 / start, 0.0, 1 / start])
    again = MazeEnv(size=9, trail=1)  # a state rebuilt mid-episode keeps the start's route as its measure
    assert task.progress(again.reset(options={"init_state": env.get_state()})[1]) == pytest.approx(1 / start)
    for move in expert_actions(env.maze, env.agent, env.target)[:-1]:
        info = env.step(move)[4]
    assert task.progress(info) == 1.0


@settings(max_examples=50, deadline=None)
@given(seed=seeds, size=sizes)
def test_branches_around_a_cell_of_a_perfect_maze_partition_the_rest(seed, size):
    env = MazeEnv(size=size)
    env.reset(seed=seed)
    floor = [tuple(c) for c in np.argwhere(env.maze == 0)]
    cell = floor[seed % len(floor)]
    sizes = [branch_size(env.maze, cell, (cell[0] + dr, cell[1] + dc)) for dr, dc in DELTAS]
    assert sum(sizes) == len(floor) - 1  # a tree: every other cell lies behind exactly one neighbour


BACK = {"right": "left", "left": "right", "up": "down", "down": "up"}  # the move that undoes each move


def cell_colour(image, cell, px=16):
    return tuple(image[cell[0] * px + 1, cell[1] * px + 1])  # a corner pixel: the agent's disc leaves it


def test_trail_variant_tints_the_cells_left_and_the_walls_hit_and_survives_a_state_round_trip():
    from envs.registry import get_environment
    trail, plain = get_environment("maze_2d/hard_trail"), get_environment("maze_2d/hard")
    row = trail.make_rows(1_000_000, 1, 49)[0]
    assert row["maze"] == plain.make_rows(1_000_000, 1, 49)[0]["maze"]  # the same mazes, seed for seed
    env, bare = trail.make_env(16, 49), plain.make_env(16, 49)
    env.reset(options={"init_state": trail.init_state(row)})
    bare.reset(options={"init_state": plain.init_state(row)})
    route = [m for m in expert_actions(env.maze, env.agent, env.target) if m != "stop"]
    visited = [env.agent]
    for move in route[:3]:
        obs, *_ = env.step(f"<action>{move}</action>")
        bare_obs, *_ = bare.step(f"<action>{move}</action>")
        visited.append(env.agent)
    assert [cell_colour(obs, c) for c in visited[:3]] == [TRAIL_RGB] * 3
    assert [cell_colour(bare_obs, c) for c in visited[:3]] == [FLOOR_RGB] * 3  # the VisGym picture is untouched
    assert cell_colour(obs, visited[3]) == FLOOR_RGB  # where the agent stands is not yet left
    wall = next(m for m in MOVES if env.maze[env.agent[0] + DELTAS[MOVES.index(m)][0],
                                              env.agent[1] + DELTAS[MOVES.index(m)][1]] == 1)
    wall_cell = (env.agent[0] + DELTAS[MOVES.index(wall)][0], env.agent[1] + DELTAS[MOVES.index(wall)][1])
    hit, *_ = env.step(f"<action>{wall}</action>")
    bare_hit, *_ = bare.step(f"<action>{wall}</action>")
    assert cell_colour(hit, wall_cell) == BUMP_RGB and cell_colour(bare_hit, wall_cell) == WALL_RGB
    assert ((hit != obs).any(axis=2) == np.isin(np.arange(11 * 16) // 16, wall_cell[0])[:, None]
            & np.isin(np.arange(11 * 16) // 16, wall_cell[1])[None, :]).all()  # only that wall changed
    assert (env.step(f"<action>{wall}</action>")[0] == hit).all()  # the same wall again: nothing new
    obs = hit
    again = trail.make_env(16, 49)
    assert (again.reset(options={"init_state": env.get_state()})[0] == obs).all()
    for move in route[3:]:
        obs, *_ = env.step(f"<action>{move}</action>")
    back = BACK[route[-1]]
    obs, *_ = env.step(f"<action>{back}</action>")  # off the goal again: it stays red
    assert cell_colour(obs, env.target) == GOAL_RGB


def test_marks_variant_paints_the_cells_walked_back_out_of_and_survives_a_state_round_trip():
    from envs.registry import get_environment
    from envs.render import MARK_RGB
    marks, trail = get_environment("maze_2d/hard_marks"), get_environment("maze_2d/hard_trail")
    row = marks.make_rows(1_000_000, 1, 49)[0]
    assert row["maze"] == trail.make_rows(1_000_000, 1, 49)[0]["maze"]
    seen = {}
    for name, task in (("marks", marks), ("trail", trail)):
        env = task.make_env(16, 49)
        env.reset(options={"init_state": task.init_state(row)})
        start = env.agent
        first = expert_actions(env.maze, env.agent, env.target)[0]
        obs, *_ = env.step(f"<action>{first}</action>")
        ahead = env.agent
        for move in (BACK[first], first, BACK[first]):  # back to the start, out again, back again
            obs, *_ = env.step(f"<action>{move}</action>")
        seen[name] = obs, env
    (obs, env), (trail_obs, _) = seen["marks"], seen["trail"]
    assert env.agent == start and cell_colour(obs, ahead) == MARK_RGB and cell_colour(trail_obs, ahead) == TRAIL_RGB
    assert cell_colour(obs, start) == cell_colour(trail_obs, start) == TRAIL_RGB  # the start has no way back
    differs = (obs != trail_obs).any(axis=2)
    assert differs.sum() == 16 * 16 and differs[ahead[0] * 16:(ahead[0] + 1) * 16, ahead[1] * 16:(ahead[1] + 1) * 16].all()
    again = marks.make_env(16, 49)
    assert (again.reset(options={"init_state": env.get_state()})[0] == obs).all()
    with pytest.raises(ValueError, match="trail must be 0, 1 or 2"):
        MazeEnv(trail=3)


def tremaux_answer(picture, px=16):
    """Tremaux's rule read off the picture alone: the goal if it is next door, else an untinted floor
    cell, else a tinted one (the way back), a green one last; in a fixed order among equals."""
    from envs.render import MARK_RGB
    n = picture.shape[0] // px
    agent = next((r, c) for r in range(n) for c in range(n)
                 if tuple(picture[r * px + px // 2, c * px + px // 2]) == AGENT_RGB)
    if cell_colour(picture, agent, px) == GOAL_RGB:
        return "<action>stop</action>"
    near = {m: cell_colour(picture, (agent[0] + dr, agent[1] + dc), px) for m, (dr, dc) in zip(MOVES, DELTAS)}
    move = next(m for wanted in (GOAL_RGB, FLOOR_RGB, TRAIL_RGB, MARK_RGB) for m, c in near.items() if c == wanted)
    return f"<action>{move}</action>"


def test_the_marks_let_a_rule_that_reads_only_the_picture_explore_every_maze_without_pacing():
    from envs.registry import get_environment
    solved = {}
    for name in ("maze_2d/hard_marks", "maze_2d/hard_trail"):
        task = get_environment(name)
        solved[name] = 0
        for row in task.make_rows(1_000_000, 16, 49):
            env = task.make_env(16, 2 * 48 + 1)  # a depth-first walk of 49 floor cells, and the stop
            picture, _ = env.reset(options={"init_state": task.init_state(row)})
            done = False
            while not done:
                picture, reward, terminated, truncated, _ = env.step(tremaux_answer(picture))
                done = terminated or truncated
            solved[name] += reward == 1.0
    assert solved["maze_2d/hard_marks"] == 16  # a depth-first search: every maze, within its bound
    assert solved["maze_2d/hard_trail"] < 8  # the single tint: back among tinted cells, it paces
