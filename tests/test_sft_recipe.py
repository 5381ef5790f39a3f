"""The embedded base's supervised recipe works through the environment interface: each task's
expert episodes become training sequences in the exact rollout format, the expert's answers are
the only targets (exploration noise is executed, never taught), and an episode ends with `stop`
on the goal."""
import random

import numpy as np
import pytest

from envs.expert import goal_fields, optimal_moves
from envs.generate import DELTAS
from envs.maze import MazeEnv
from envs.registry import get_environment
from rl.inputs import task_prompter
from settings import load_config
from sft.embedded_base import expert_turns, maze_pictures
from vlm.load import load_processor


@pytest.mark.parametrize("config, env_id", [(None, "maze_2d/easy"), (None, "maze_2d/easy_trail"),
                                             ("configs/sliding_block.yaml", "sliding_block/easy")])
def test_expert_episodes_teach_only_the_experts_answers(config, env_id):
    embedded_processor = load_processor("assets/maze-vl-base")
    cfg = load_config(config, [f"environment.env_class={env_id}"])
    task = get_environment(env_id)
    prompter = task_prompter(embedded_processor, task, cfg.environment.cell_px)
    tok = embedded_processor.tokenizer
    for seed in range(6):
        env = task.make_env(cfg.environment.cell_px, cfg.generator.max_turns)
        env.reset(seed=seed)
        shadow = task.make_env(cfg.environment.cell_px, cfg.generator.max_turns)  # replays what was executed
        shadow.reset(seed=seed)
        seqs = expert_turns(task, env, prompter, 2, 1, random.Random(seed), eps=0.0)
        answers = [tok.decode([t for t, m in zip(s.input_ids, s.loss_mask) if m], skip_special_tokens=True)
                   for s in seqs]
        for answer in answers[:-1]:
            assert answer == task.expert_answer(shadow) and shadow.parse(answer) not in (None, "stop")
            shadow.step(answer)
        assert shadow.parse(answers[-1]) == "stop" and shadow.at_goal()  # stopped on the goal, no noise
        assert all(len(s.images) == 1 for s in seqs)  # one picture a turn (context_pictures=1)

    # with noise, the executed random moves show in later prompts but are never a target
    env = task.make_env(cfg.environment.cell_px, cfg.generator.max_turns)
    env.reset(seed=0)
    noisy = expert_turns(task, env, prompter, 2, 1, random.Random(0), eps=1.0)
    taught = {tok.decode([t for t, m in zip(s.input_ids, s.loss_mask) if m], skip_special_tokens=True) for s in noisy}
    assert all(env.parse(a) is not None for a in taught)
    assert len(noisy) >= 2 and sum(s.loss_mask[-1] for s in noisy) == len(noisy)


def test_perception_pictures_take_each_size_in_turn_and_label_every_floor_cell():
    sizes = (9, 11)
    envs = {size: MazeEnv(size=size, cell_px=16) for size in sizes}
    images, mazes = maze_pictures(envs, sizes, 123, 4, np.random.default_rng(0))
    assert [image.shape[:2] for image in images] == [(144, 144), (176, 176), (144, 144), (176, 176)]
    assert not np.array_equal(mazes[0].maze, mazes[2].maze)  # each picture keeps its own maze, not the env's last
    for env in mazes:
        assert env.maze[env.agent] == 0  # the disc on a floor cell
        move, distance = goal_fields(env.maze, env.target)
        assert move[env.target] == 4 and distance[env.target] == 0
        for cell in map(tuple, np.argwhere(env.maze == 0)):
            assert distance[cell] == optimal_moves(env.maze, cell, env.target)
            if cell != tuple(env.target):  # the labelled move is one step closer
                dr, dc = DELTAS[move[cell]]
                assert distance[cell[0] + dr, cell[1] + dc] == distance[cell] - 1
        assert (move[env.maze != 0] == -1).all() and (distance[env.maze != 0] == -1).all()


def test_block_perception_trains_the_tower_alone_on_both_pictures():
    """Stage C0 (--block-perception-steps): block ids on sliding-block pictures and the maze's moves,
    one label a picture token; only the vision tower moves, the language layers keep stage B's weights."""
    import torch
    from safetensors.torch import load_model

    from envs.prompt import tokenizer_corpus
    from sft.embedded_base import block_perception_stage, block_pictures
    from vlm.build import EmbeddedArch, build_random_base
    images, labels = block_pictures(5, 4, 16)
    assert [image.shape[:2] for image in images] == [(80, 144)] * 4 and all(len(ids) == 5 * 9 for ids in labels)
    assert all(set(ids) == set(range(-1, 11)) for ids in labels)  # every block, empty cells and the gap
    arch = EmbeddedArch()
    model, processor = build_random_base(arch, 0, tokenizer_corpus())
    load_model(model, "assets/maze-vl-base/model.safetensors")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.train()
    accuracy = block_perception_stage(model, processor, arch, 3, 8, 1e-3, 0, (9, 11))
    assert set(accuracy) == {"blocks", "nine_or_ten", "maze_moves"} and all(0 <= v <= 1 for v in accuracy.values())
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all(n.startswith("model.visual.") for n in moved)
