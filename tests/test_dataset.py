"""Datasets: byte-identical for the same arguments, disjoint splits, the filter recorded."""
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from envs.actions import MOVES
from envs.dataset import init_state, make_rows, start_at_junctions, start_in_detours, write_dataset
from envs.expert import shortest_path
from envs.generate import DELTAS
from envs.maze import MazeEnv
from envs.rows import load_rows
from rl.sampler import PromptSampler, repeat_long_routes
from settings import load_config

ROOT = Path(__file__).resolve().parent.parent


def test_same_arguments_give_identical_bytes_through_the_cli(tmp_path):
    outs = []
    for name in ("a", "b"):
        r = subprocess.run([sys.executable, "driver.py", "--make-dataset", str(tmp_path / name)],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        outs.append({f: (tmp_path / name / f).read_bytes() for f in ("train.jsonl", "eval.jsonl", "manifest.json")})
    assert outs[0] == outs[1]
    manifest = json.loads(outs[0]["manifest.json"])
    assert manifest["splits"]["eval"]["sha256"] == hashlib.sha256(outs[0]["eval.jsonl"]).hexdigest()
    data = load_config(None).data  # the CLI builds the default config's sets
    assert manifest["splits"]["train"]["rows"] == data.train_size and manifest["splits"]["eval"]["rows"] == 64


def test_splits_are_disjoint_and_filter_is_recorded(tmp_path):
    m = write_dataset(tmp_path, "maze_2d/easy", 40, 20, 0, 1000, max_turns=15, solvable_only=True)
    train, evals = load_rows(tmp_path / "train.jsonl"), load_rows(tmp_path / "eval.jsonl")
    assert not {r["seed"] for r in train} & {r["seed"] for r in evals}
    assert all(r["optimal_moves"] + 1 <= 15 for r in train + evals)
    assert m["filter"]["solvable_only"] is True and m["splits"]["train"]["skipped_by_filter"] > 0
    lo, hi = m["splits"]["eval"]["seed_range"]
    assert all(lo <= r["seed"] < hi for r in evals)
    unfiltered = write_dataset(tmp_path / "all", "maze_2d/hard", 10, 10, 0, 1000, 15, solvable_only=False)
    assert unfiltered["splits"]["train"]["skipped_by_filter"] == 0
    rows = load_rows(tmp_path / "all" / "train.jsonl")
    assert [r["seed"] for r in rows] == list(range(10)) and len(rows[0]["maze"]) == 11


def test_the_validation_split_has_its_own_seeds_above_the_eval_set(tmp_path):
    m = write_dataset(tmp_path, "maze_2d/easy", 20, 10, 0, 1000, 20, True, validation_size=12, validation_seed_start=5000)
    splits = {name: load_rows(tmp_path / f"{name}.jsonl") for name in ("train", "eval", "validation")}
    seeds = {name: {r["seed"] for r in rows} for name, rows in splits.items()}
    assert len(splits["validation"]) == 12 and min(seeds["validation"]) >= 5000
    assert not seeds["validation"] & (seeds["train"] | seeds["eval"])
    assert m["splits"]["validation"]["sha256"] == hashlib.sha256((tmp_path / "validation.jsonl").read_bytes()).hexdigest()
    assert "validation" not in write_dataset(tmp_path / "none", "maze_2d/easy", 4, 4, 0, 1000, 20, True)["splits"]
    with pytest.raises(ValueError, match="validation_seed_start .* above the eval seeds"):
        write_dataset(tmp_path / "bad", "maze_2d/easy", 4, 4, 0, 1000, 20, True, validation_size=4,
                      validation_seed_start=1002)


def test_rows_rebuild_their_maze(tmp_path):
    write_dataset(tmp_path, "maze_2d/easy", 3, 3, 0, 100, 15, True)
    row = load_rows(tmp_path / "eval.jsonl")[0]
    a, b = MazeEnv(), MazeEnv()
    a.reset(seed=row["seed"])
    b.reset(options={"init_state": init_state(row)})
    assert (a.maze == b.maze).all() and a.agent == b.agent == tuple(row["start"])
    assert b.optimal_moves() == row["optimal_moves"]


def test_malformed_rows_are_reported_with_their_line(tmp_path):
    bad = tmp_path / "eval.jsonl"
    bad.write_text('{"seed": 1}\n')
    try:
        load_rows(bad)
    except ValueError as e:
        assert "eval.jsonl:1" in str(e)
    else:
        raise AssertionError("a malformed row was accepted")


def test_env_ceiling_is_the_unfiltered_share_of_solvable_mazes():
    """The eval set is filtered to solvable mazes (ceiling 100%); the env's own ceiling is not."""
    from envs.dataset import env_ceiling, make_rows
    rows, _ = make_rows("maze_2d/easy", 0, 300, 20, solvable_only=False)
    assert env_ceiling("maze_2d/easy", 20, 300) == sum(r["optimal_moves"] <= 19 for r in rows) / 300
    assert 0.85 < env_ceiling("maze_2d/easy", 20, 300) < 1.0  # some easy mazes need more than 19 moves
    assert env_ceiling("maze_2d/hard", 15, 100) == 0.0  # no 11x11 maze fits in 15 turns (16 moves at least)
    assert env_ceiling("maze_2d/hard", 49, 100) == 1.0  # 25 rooms: at most 48 moves and the stop


def test_long_route_share_sets_the_train_mix_from_fresh_seeds(tmp_path):
    natural, _ = make_rows("maze_2d/easy", 0, 40, 20, solvable_only=True)
    assert sum(r["optimal_moves"] > 12 for r in natural) < 20  # long routes are the minority as drawn
    for share, want_long in ((0.5, 20), (0.0, 0), (1.0, 40), (0.33, 13)):
        rows, scanned = make_rows("maze_2d/easy", 0, 40, 20, solvable_only=True, long_route_share=share)
        seeds = [r["seed"] for r in rows]
        assert len(rows) == 40 and seeds == sorted(set(seeds))  # distinct mazes, none repeated
        assert sum(r["optimal_moves"] > 12 for r in rows) == want_long
        assert all(r["optimal_moves"] + 1 <= 20 for r in rows)
    # the first seeds of each kind, as the natural draw would give them
    assert [r["seed"] for r in rows if r["optimal_moves"] > 12][:3] == [r["seed"] for r in natural if r["optimal_moves"] > 12][:3]
    m = write_dataset(tmp_path, "maze_2d/easy", 40, 8, 0, 1000, 20, True, long_route_share=0.5)
    assert m["filter"]["train_long_route_share"] == 0.5 and m["splits"]["train"]["optimal_moves"] == {"12": 20, "16": 20}
    assert m["splits"]["eval"]["seed_range"][0] == 1000 and sum(m["splits"]["eval"]["optimal_moves"].values()) == 8


def test_junction_start_share_moves_that_share_of_train_starts_to_a_junction_of_the_route(tmp_path):
    rows, _ = make_rows("maze_2d/easy", 0, 40, 20, solvable_only=True)
    out = start_at_junctions(rows, 0.5, seed=0)
    moved = [(r, o) for r, o in zip(rows, out) if o["start"] != r["start"]]
    assert 15 <= len(moved) <= 20  # 20 chosen; a route without a junction keeps its corner
    for row, new in moved:
        maze, cell = np.asarray(row["maze"]), tuple(new["start"])
        route = shortest_path(maze, row["start"], row["goal"])
        assert cell in route[1:-1]  # on the optimal route, neither end
        assert sum(maze[cell[0] + dr, cell[1] + dc] == 0 for dr, dc in DELTAS) >= 3  # a branch to get wrong
        assert new["optimal_moves"] == len(shortest_path(maze, cell, row["goal"])) - 1 < row["optimal_moves"]
        assert {k: v for k, v in new.items() if k not in ("start", "optimal_moves")} == \
            {k: v for k, v in row.items() if k not in ("start", "optimal_moves")}
    assert start_at_junctions(rows, 0.5, seed=0) == out and start_at_junctions(rows, 0.5, seed=1) != out
    assert start_at_junctions(rows, 0.0, seed=0) == rows
    # in a dataset only the train split moves, and the manifest says how
    m = write_dataset(tmp_path / "j", "maze_2d/easy", 40, 8, 0, 1000, 20, True, junction_start_share=0.5)
    plain = write_dataset(tmp_path / "p", "maze_2d/easy", 40, 8, 0, 1000, 20, True)
    assert m["filter"]["train_junction_start_share"] == 0.5 and plain["filter"]["train_junction_start_share"] == 0.0
    assert load_rows(tmp_path / "j" / "train.jsonl") == start_at_junctions(rows, 0.5, seed=0)
    assert (tmp_path / "j" / "eval.jsonl").read_bytes() == (tmp_path / "p" / "eval.jsonl").read_bytes()


def test_detour_starts_put_the_agent_in_a_wrong_branch_as_if_it_had_walked_there(tmp_path):
    rows, _ = make_rows("maze_2d/hard_trail", 0, 40, 49, solvable_only=True)
    out = start_in_detours(rows, 0.5, seed=0, max_turns=49)
    moved = [(r, o) for r, o in zip(rows, out) if o != r]
    assert len(moved) == 20  # every hard route has a fork
    depths = set()
    for row, new in moved:
        maze = np.asarray(row["maze"])
        route = shortest_path(maze, row["start"], row["goal"])
        walked = [tuple(c) for c in new["trail"]] + [tuple(new["start"])]
        assert tuple(new["start"]) not in route and walked[0] == tuple(row["start"])
        fork = max(i for i, c in enumerate(walked) if c in route)  # the route, then only the branch
        assert walked[:fork + 1] == route[:fork + 1] and not set(walked[fork + 1:]) & set(route)
        depths.add(len(walked) - 1 - fork)
        assert new["optimal_moves"] == len(shortest_path(maze, walked[-1], row["goal"])) - 1 <= 48
        # the rebuilt episode is the one that walked there: same picture, same trail, same way back
        env, replay = MazeEnv(11, 8, 49, trail=2), MazeEnv(11, 8, 49, trail=2)
        env.reset(options={"init_state": init_state(new)})
        replay.reset(options={"init_state": init_state(row)})
        for a, b in zip(walked, walked[1:]):
            replay.step(MOVES[DELTAS.index((b[0] - a[0], b[1] - a[1]))])
        assert (env.observation() == replay.observation()).all()
        walked_there = {k: v for k, v in replay.get_state().items() if k not in ("turn", "start_moves")}
        assert {k: v for k, v in env.get_state().items() if k != "turn"} == walked_there | {"start_moves": new["optimal_moves"]}
        assert env.turn == 0
    assert len(depths) > 2  # random depths into the branch, not always its dead end
    assert start_in_detours(rows, 0.5, seed=0, max_turns=49) == out and start_in_detours(rows, 0.0, 0, 49) == rows
    # a detour that leaves no solution within max_turns keeps the corner
    assert all(r.get("trail") is None or r["optimal_moves"] + 1 <= 30 for r in start_in_detours(rows, 1.0, 0, 30))
    m = write_dataset(tmp_path, "maze_2d/hard_trail", 40, 8, 0, 1000, 49, True, detour_start_share=0.5)
    assert m["filter"]["train_detour_start_share"] == 0.5
    assert load_rows(tmp_path / "train.jsonl") == start_in_detours(rows, 0.5, seed=1, max_turns=49)
    assert not any("trail" in r for r in load_rows(tmp_path / "eval.jsonl"))


def test_long_routes_are_drawn_repeats_times_an_epoch():
    rows, _ = make_rows("maze_2d/easy", 0, 40, 20, solvable_only=True)
    long = [r["seed"] for r in rows if r["optimal_moves"] > 12]
    assert 0 < len(long) < len(rows)  # both kinds in the set
    sampler = PromptSampler(repeat_long_routes(rows, 3), 1, seed=0)
    drawn = [r["seed"] for _ in range(sampler.steps_per_epoch) for r in sampler.next_batch()[0]]
    assert len(drawn) == len(rows) + 2 * len(long)
    assert all(drawn.count(s) == (3 if s in long else 1) for s in {r["seed"] for r in rows})
    assert repeat_long_routes(rows, 1) == rows
