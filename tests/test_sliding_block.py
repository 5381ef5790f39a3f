"""The sliding-block puzzle's contract, as VisGym states its rules: blocks slide one cell into empty
cells, a move that cannot be made changes nothing, only `stop` on the target layout pays 1.0, and
the BFS expert's moves always solve the puzzle in its optimal number."""
import numpy as np
import pytest

from actors.env_pool import EnvPool
from envs.registry import get_environment
from envs.sliding_block import (
    DIRECTIONS,
    INVALID_ACTION,
    SOLVED,
    SlidingBlockEnv,
    parse_move,
    shortest_moves,
    slide,
    twin_boards,
    without_ids,
)
from envs.sliding_block_task import make_rows, move_text


def test_moves_walls_and_blocks():
    env = SlidingBlockEnv(shuffle_moves=3, cell_px=16, max_turns=10)
    env.reset(seed=0)
    before = dict(env.positions)
    _, reward, term, trunc, info = env.step("<action>1 up</action>")  # the 2x2 block sits on the top edge
    assert env.positions == before and info["feedback"] == "Block 1 cannot move up." and info["valid_action"]
    _, _, _, _, info = env.step("<action>3 right</action>")  # into block 1
    assert env.positions == before and info["feedback"] == "Block 3 cannot move right."
    _, reward, term, _, info = env.step("<action>9 down</action>")  # into the empty cell below it
    assert env.positions[9] == (4, 1) and info["feedback"] == "Moved block 9 down." and (reward, term) == (0.0, False)
    _, _, _, _, info = env.step("<action>10 left</action>")  # the cell block 9 left
    assert env.positions[10] == (3, 1)
    _, reward, term, _, info = env.step("nonsense")
    assert info["feedback"] == INVALID_ACTION and not info["valid_action"] and reward == 0.0 and not term


def test_both_answer_formats_and_the_last_action_counts():
    assert parse_move("('move', (7, 0))") == parse_move("<action>7 up</action>") == (7, 0)
    assert parse_move("('stop', 'stop')") == parse_move("<action>STOP</action>") == "stop"
    assert parse_move("<action>7 up</action> then ('move', (8, 3))") == (8, 3)
    assert parse_move("<action>7 sideways</action>") is None and parse_move(None) is None


@pytest.mark.parametrize("env_id", ["sliding_block/easy", "sliding_block/hard"])
def test_the_expert_solves_every_row_in_its_optimal_moves(env_id):
    environment = get_environment(env_id)
    rows, _ = make_rows(env_id, 100, 24, max_turns=20, solvable_only=True)
    for row in rows:
        env = environment.make_env(16, 20)
        env.reset(options={"init_state": environment.init_state(row)})
        plan = shortest_moves(dict(SOLVED), env.target)
        assert len(plan) == row["optimal_moves"] >= 1
        _, reward, term, _, _ = env.step("<action>stop</action>")  # not there yet
        assert (reward, term) == (0.0, True)
        env.reset(options={"init_state": environment.init_state(row)})
        for block, direction in plan:
            _, reward, term, _, info = env.step(f"<action>{block} {DIRECTIONS[direction]}</action>")
            assert not term and info["valid_action"]
        assert info["solved"]
        _, reward, term, _, _ = env.step("('stop', 'stop')")
        assert (reward, term) == (1.0, True)


def test_truncated_at_max_turns_and_the_picture_shows_both_boards():
    env = SlidingBlockEnv(shuffle_moves=3, cell_px=16, max_turns=2)
    image, _ = env.reset(seed=3)
    assert image.shape == (5 * 16, 9 * 16, 3)
    target, current = image[:, :64], image[:, 80:]
    assert not np.array_equal(target, current)  # the target is shuffled, the agent starts solved
    env.step("<action>9 down</action>")
    _, _, term, trunc, _ = env.step("<action>9 up</action>")
    assert trunc and not term


def test_through_the_env_pool_and_the_registry(tmp_path):
    """The task behind the interface: rows written and read back by their own environment, episodes
    in the EnvPool, the GiGPO state key the board layout."""
    from envs.rows import load_rows
    from settings import load_config
    cfg = load_config(None, ["environment.env_class=sliding_block/easy", "data.train_size=16", "data.eval_size=4",
                             "generator.max_turns=10"])
    environment = get_environment("sliding_block/easy")
    manifest = environment.write_dataset(tmp_path / "a", cfg.data, 10)
    environment.write_dataset(tmp_path / "b", cfg.data, 10)
    assert (tmp_path / "a" / "train.jsonl").read_bytes() == (tmp_path / "b" / "train.jsonl").read_bytes()
    assert manifest["env_id"] == "sliding_block/easy" and manifest["splits"]["eval"]["rows"] == 4
    rows = load_rows(tmp_path / "a" / "eval.jsonl")
    pool = EnvPool("sliding_block/easy", cell_px=16, max_turns=10)
    starts = pool.reset(["a", "b"], seeds=[r["seed"] for r in rows[:2]],
                        init_states=[environment.init_state(r) for r in rows[:2]])
    assert starts[0]["state_key"] == starts[1]["state_key"]  # both start from the solved layout
    out = pool.step(["a", "b"], ["<action>9 down</action>", "<action>1 up</action>"])
    assert out[0]["state_key"] != out[1]["state_key"] and out[1]["state_key"] == starts[1]["state_key"]
    # the progress GiGPO's progress_reward reads: the share of blocks on their target cells, 1 when solved
    target = {int(b): tuple(p) for b, p in rows[0]["target"].items()}
    assert starts[0]["progress"] == sum(SOLVED[b] == target[b] for b in SOLVED) / len(SOLVED) < 1
    pool.reset(["a"], seeds=[rows[0]["seed"]], init_states=[environment.init_state(rows[0])])
    for block, direction in shortest_moves(dict(SOLVED), target):
        [step] = pool.step(["a"], [move_text(block, direction)])
    assert step["progress"] == 1.0 and step["info"]["solved"]


def test_its_splits_use_disjoint_seed_ranges(tmp_path):
    """The same seed-range rules as the maze's sets (envs.rows.seed_splits): a validation range that
    overlaps the eval seeds is refused."""
    from settings import load_config
    cfg = load_config(None, ["environment.env_class=sliding_block/easy", "data.train_size=16", "data.eval_size=4",
                             "data.validation_size=4", "data.validation_seed_start=1000001"])
    with pytest.raises(ValueError, match="must be above the eval seeds"):
        get_environment("sliding_block/easy").write_dataset(tmp_path, cfg.data, 10)


def play(*moves) -> dict:
    positions = dict(SOLVED)
    for block, direction in moves:
        positions = slide(positions, block, DIRECTIONS.index(direction))
    return positions


def test_twin_boards_are_the_ones_that_look_like_another_as_near_the_start():
    """The boards a policy blind to the digits confuses (bench/twin_boards.py): "9 down, 9 right,
    7 right" and "7 right, 10 down, 9 right" end on the same picture with 9 and 10 swapped, both in
    three moves; "7 right" alone looks like no other layout one move from the start."""
    own, twin = play((9, "down"), (9, "right"), (7, "right")), play((7, "right"), (10, "down"), (9, "right"))
    assert without_ids(own) == without_ids(twin) and own != twin
    one = play((7, "right"))
    assert twin_boards([own, twin, one]) == [True, True, False]
    # a look-alike nearer the start makes the farther board a twin, not the nearer one
    near, far = play((9, "down")), play((10, "down"), (9, "right"), (10, "left"))
    assert without_ids(near) == without_ids(far)
    assert twin_boards([near, far]) == [False, True]


def test_the_block_probe_labels_each_cell_with_the_block_drawn_there():
    """The block-id labels (bench/perception_probe.py --blocks, the base's stage C0): a cell's label is
    the block whose colour fills that cell."""
    from envs.sliding_block import COLOURS, SIZES, SlidingBlockEnv, block_ids
    env = SlidingBlockEnv(shuffle_moves=6, cell_px=16)
    env.reset(seed=3)
    image, ids = env.render(), block_ids(env)
    assert ids.shape == (5, 9) and (ids[:, 4] == -1).all()
    for board in (ids[:, :4], ids[:, 5:]):
        assert sorted(np.unique(board).tolist()) == list(range(11)) and (board == 0).sum() == 2
    for r, c in np.ndindex(ids.shape):
        corner = tuple(image[r * 16 + 2, c * 16 + 2])  # inside the outline, clear of the digit
        want = (255, 255, 255) if ids[r, c] == 0 else (128, 128, 128) if ids[r, c] < 0 else COLOURS[SIZES[ids[r, c]]]
        assert corner == want, (r, c, ids[r, c])



def test_a_rollout_records_how_much_nearer_the_goal_each_turn_went():
    """Turn.progress, what GiGPO's progress_reward reads: the change a turn made to the share of blocks
    on their target cells. The expert's moves then stop: the gains add up to what was left to place."""
    from inference.requests import GenResult, Sampling
    from rl.inputs import make_prompters
    from rl.rollout import RolloutRunner, rollout_tasks
    from settings import load_config
    from vlm.processor import load_processor
    [row] = get_environment("sliding_block/easy").make_rows(0, 1, 10)
    target = {int(b): tuple(p) for b, p in row["target"].items()}
    answers = iter([move_text(b, d) for b, d in shortest_moves(dict(SOLVED), target)] + ["<action>stop</action>"])

    def play(requests, sampling, version):
        return [GenResult([1], [0.0], next(answers), "stop", version, len(r.prompt_ids)) for r in requests]

    cfg = load_config(None, ["environment.env_class=sliding_block/easy"])
    runner = RolloutRunner(play, EnvPool("sliding_block/easy", 16, 10),
                           make_prompters(load_processor("assets/maze-vl-base"), cfg), 10, 4096)
    [episode] = runner.run(rollout_tasks([row], 0, 1), Sampling(max_new_tokens=8), 0)
    start = sum(SOLVED[b] == target[b] for b in SOLVED) / len(SOLVED)
    gains = [t.progress for t in episode.turns]
    assert episode.reward == 1.0 and len(gains) == row["optimal_moves"] + 1
    assert abs(sum(gains) - (1.0 - start)) < 1e-9 and gains[-1] == 0.0  # the stop moves nothing


@pytest.mark.parametrize("explore", [0.0, 1.0])
def test_an_episode_back_where_it_was_explores_a_random_legal_move(explore):
    """generator.explore_revisits: a policy stuck pushing a block that cannot move ("1 up") is back in
    the same state every turn; with explore=1 each such turn plays a random legal move instead, as the
    ids the model would sample, with NaN log-probs (no engine sampled it). Turns from a new state stay
    sampled; the draws repeat with the seed; with explore=0 nothing is replaced."""
    import math

    from inference.requests import GenResult, Sampling
    from rl.inputs import make_prompters
    from rl.rollout import RolloutRunner, rollout_tasks
    from settings import load_config
    from vlm.processor import load_processor
    [row] = get_environment("sliding_block/easy").make_rows(0, 1, 10)

    def push_block_1_up(requests, sampling, version):
        return [GenResult([7], [-0.5], "<action>1 up</action>", "stop", version) for _ in requests]

    cfg = load_config(None, ["environment.env_class=sliding_block/easy"])
    prompters = make_prompters(load_processor("assets/maze-vl-base"), cfg)
    runner = RolloutRunner(push_block_1_up, EnvPool("sliding_block/easy", 16, 10), prompters, 10, 4096)

    def play():
        [episode] = runner.run(rollout_tasks([row], 0, 1), Sampling(max_new_tokens=8, seed=3), 0, explore=explore)
        return episode

    episode = play()
    assert len(episode.turns) == 10 and episode.turns[0].text == "<action>1 up</action>"
    seen = set()
    for turn in episode.turns:
        revisit = turn.state in seen
        seen.add(turn.state)
        assert turn.explored == (revisit and explore == 1.0)
        if turn.explored:
            assert turn.feedback.startswith("Moved block") and parse_move(turn.text) not in (None, "stop")
            assert turn.response_ids == prompters["sliding_block/easy"].answer_ids(turn.text)
            assert all(math.isnan(lp) for lp in turn.logprobs)
        else:
            assert turn.text == "<action>1 up</action>" and turn.logprobs == [-0.5]
    explored = [t.text for t in episode.turns if t.explored]
    assert (len(explored) >= 4) == (explore == 1.0)  # every other turn: a sampled push, then a random move
    assert [t.text for t in play().turns if t.explored] == explored
    assert episode.generated_tokens == sum(not t.explored for t in episode.turns)  # only the sampled ones count
    with pytest.raises(ValueError, match="no live episodes"):
        runner.env.random_answers([episode.episode_id], [0])  # closed when the rollout ended


def test_the_twin_board_report_splits_a_runs_episodes_by_board():
    from bench.twin_boards import split
    boards = [play((9, "down"), (9, "right"), (7, "right")), play((7, "right"))]
    rows = [{"seed": s, "target": {str(b): list(p) for b, p in t.items()}} for s, t in zip((5, 6), boards)]
    episodes = [{"seed": 5, "solved": False}, {"seed": 6, "solved": True}, {"seed": 6, "solved": True}]
    assert split(rows, episodes) == {"all": (2, 3), "twins": (0, 1), "others": (2, 2)}


def test_first_move_probabilities_rank_the_move_greedy_decoding_plays():
    """bench/twin_boards.py --first-moves scores each legal first answer on the rollout's own first
    prompt: its most probable answer is the one the model writes greedily, and the answers' mass is
    at most 1."""
    from bench.twin_boards import first_move_probabilities
    from rl.inputs import environment_of, task_prompter
    from settings import load_config
    from vlm.forward import TrainSeq, collate
    from vlm.load import load_model
    model, processor = load_model("assets/maze-vl-base", speedups=False)
    cfg = load_config("configs/sliding_block.yaml", [])
    board = play((9, "down"), (9, "right"), (7, "right"))
    row = {"seed": 0, "env_id": "sliding_block/easy", "target": {str(b): list(p) for b, p in board.items()}}
    probs = first_move_probabilities(model, processor, [row], cfg)[0]
    assert 0.5 < sum(probs.values()) <= 1.0 + 1e-6
    picture, _ = SlidingBlockEnv(cell_px=cfg.environment.cell_px).reset(options={"init_state": row})
    prompt, _ = task_prompter(processor, environment_of(cfg), cfg.environment.cell_px).prompt([""], [], 2, 1)
    batch = collate([TrainSeq("greedy", prompt, [0] * len(prompt), [0.0] * len(prompt), [picture])], processor, "cpu")
    batch.pop("loss_mask")
    written = processor.tokenizer.decode(model.generate(**batch, max_new_tokens=8, do_sample=False)[0, len(prompt):],
                                         skip_special_tokens=True)
    assert written == max(probs, key=probs.get)
