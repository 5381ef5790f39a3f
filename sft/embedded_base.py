"""Build the embedded base model: random init, then supervised stages A, A2, B and C, stopped short.

    python -m sft.embedded_base --out assets/maze-vl-base [--seed 0]

Stage A (perception) stands in for the vision pretraining a real VLM brings: the vision tower
plus a throw-away linear probe learn, for every cell of a maze picture (9x9 and 11x11 mazes in
turn), the BFS expert's move from that cell (dense labels: every floor cell supervised, not one
decision a picture). Stage A2
(400 steps) keeps that and adds a second probe for which cell holds the disc: the agent's own
cell then stands out among the image tokens, and the language layers learn to read its move in
tens of steps instead of hundreds. Stage B is SFT of the whole model on BFS-expert episodes in
the exact chat format rollouts use (the same prompter, context window and answer format); 20%
of the executed moves are random and left out of the loss, so recovery states are seen. Stage B
stops at the first check (every 5 steps, every step once any maze is solved) whose greedy solve
rate on 64 validation mazes (their own seeds, not the eval set) reaches --stop-at (45%), so the
base lands between 30% and 55% on the eval set: RL has work to do. Stage C teaches a second
task (--second-task, VisGym's sliding blocks) the same way, half of each batch its expert's
episodes, the other half maze turns pulled towards the stage-B model's own answers (KL to a
frozen copy: taught the new task alone, the maze fell from 45% to 0 in 10 steps), stopped once the
second task's validation solve rate reaches --second-stop-at (40%). Every stage goes through the
environment interface (envs.base: the expert's answer, a random answer, rows, the prompter).

Without stage A, SFT alone left this shape far from solving mazes (docs/embedded-base.md has
what each stage measured).

Everything is seeded (torch, the maze seeds, the move noise) and runs on fixed threads, so a
rebuild from the same seed at the same commit reproduces the shipped model byte for byte (a later
commit's forward may sum in another order: docs/embedded-base.md).
"""
from __future__ import annotations

import argparse
import copy
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model
from tqdm import tqdm

from envs.actions import ACTIONS
from envs.base import Environment
from envs.expert import direction_field
from envs.maze import MazeEnv
from envs.prompt import tokenizer_corpus
from rl.inputs import environment_of, task_prompter
from storage.atomic import replace_dir, temp_beside
from vlm.build import EmbeddedArch, build_random_base
from vlm.chat import ChatPrompter
from vlm.forward import TrainSeq, collate, sampled_logprobs

SFT_SEEDS = 10_000_000       # maze seeds for SFT: far from the train (0+) and eval (1,000,000+) sets
PROBE_SEEDS = 20_000_000
LOCATE_SEEDS = 25_000_000
VALIDATION_SEEDS = 30_000_000  # the SFT stop rule looks at these, never at the eval set
BLOCK_SEEDS = 35_000_000


def maze_pictures(envs: dict[int, MazeEnv], sizes: tuple[int, ...], first_seed: int, n: int,
                  rng: np.random.Generator) -> tuple[list[np.ndarray], list[MazeEnv]]:
    """n pictures, picture k a maze of sizes[k % len(sizes)] from seed first_seed + k with the disc on
    a random floor cell; with each a copy of its environment (the maze, the goal, the disc)."""
    images, mazes = [], []
    for k in range(n):
        env = envs[sizes[k % len(sizes)]]
        env.reset(seed=first_seed + k)
        floor = np.argwhere(env.maze == 0)
        env.agent = tuple(int(v) for v in floor[rng.integers(len(floor))])  # the disc anywhere
        images.append(env.render())
        mazes.append(copy.copy(env))
    return images, mazes


def perception_stage(model, processor, arch, steps: int, batch: int, lr: float, seed: int, sizes: tuple[int, ...],
                     locate: bool = False, first_seed: int = PROBE_SEEDS) -> dict[int, float]:
    """Train the vision tower on per-cell expert moves; returns the final per-cell accuracy by maze size.

    Picture k of a batch is a maze of sizes[k % len(sizes)]: a tower taught on 9x9 pictures only
    chose the wrong way at 11x11 junctions far from the goal (docs/embedded-base.md).
    With `locate`, a second probe also learns which cell holds the disc, so the agent's own cell
    stands out among the image tokens the language layers read."""
    vision = model.model.visual
    probe = torch.nn.Linear(arch.text_hidden, len(ACTIONS))
    params = list(vision.parameters()) + list(probe.parameters())
    if locate:  # made only here, so stage A draws exactly the random numbers it always did
        where = torch.nn.Linear(arch.text_hidden, 2)
        params += list(where.parameters())
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95))
    envs = {size: MazeEnv(size=size, cell_px=arch.cell_px) for size in sizes}
    rng = np.random.default_rng(seed)
    accs = {size: [] for size in sizes}
    bar = tqdm(range(steps), desc="SFT stage A2 (locate the agent)" if locate else "SFT stage A (perception)", unit="step")
    for step in bar:
        images, mazes = maze_pictures(envs, sizes, first_seed + step * batch, batch, rng)
        enc = processor.image_processor(images=images, return_tensors="pt")
        target = torch.tensor(np.concatenate([direction_field(env.maze, env.target).reshape(-1) for env in mazes]))
        features = vision(enc["pixel_values"], grid_thw=enc["image_grid_thw"]).pooler_output
        logits = probe(features)
        loss = torch.nn.functional.cross_entropy(logits, target, ignore_index=-1)
        if locate:
            is_agent = torch.zeros(len(target), dtype=torch.long)
            offsets = np.cumsum([0] + [env.size ** 2 for env in mazes[:-1]])
            is_agent[torch.tensor([o + env.agent[0] * env.size + env.agent[1] for o, env in zip(offsets, mazes)])] = 1
            # one agent cell against 80 or 120 others: weight it up so the probe cannot ignore it
            loss = loss + torch.nn.functional.cross_entropy(where(features), is_agent, weight=torch.tensor([1.0, 10.0]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        right = ((logits.argmax(-1) == target) & (target >= 0)).numpy()
        token_sizes = np.concatenate([np.full(env.size ** 2, env.size) for env in mazes])
        for size in sizes:
            known = (token_sizes == size) & (target >= 0).numpy()
            accs[size].append(right[known].sum() / known.sum())
        if step % 50 == 0:
            bar.set_postfix(cell_acc=" ".join(f"{size}:{np.mean(accs[size][-50:]):.3f}" for size in sizes))
    return {size: float(np.mean(accs[size][-100:])) for size in sizes}


def block_pictures(first_seed: int, n: int, cell_px: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """n sliding-block pictures (1 to 12 shuffling moves; every other current board solved) and each
    cell's block id (envs.sliding_block.block_ids: 0 empty, -1 the gap)."""
    from envs.sliding_block import SlidingBlockEnv, block_ids
    images, labels = [], []
    for k in range(n):
        env = SlidingBlockEnv(shuffle_moves=1 + (first_seed + k) % 12, cell_px=cell_px)
        env.reset(seed=first_seed + k)
        if k % 2:
            env.positions = dict(env.target)
        images.append(env.render())
        labels.append(block_ids(env).reshape(-1))
    return images, labels


def block_perception_stage(model, processor, arch, steps: int, batch: int, lr: float, seed: int,
                           maze_sizes: tuple[int, ...]) -> dict:
    """Stage C0: the vision tower learns which block covers each cell of sliding-block pictures
    (a throw-away probe over the 10 ids and empty), half of each batch, while the other half keeps a
    throw-away maze probe reading the expert's move from each cell, so the maze features stay. Blocks
    7 to 10 differ only by their digit: without this the tower told 9 from 10 in 75% of cells, and
    RL never solved the boards where they swap (docs/embedded-base.md). Returns the final accuracies."""
    vision = model.model.visual
    blocks = torch.nn.Linear(arch.text_hidden, 11)
    moves = torch.nn.Linear(arch.text_hidden, len(ACTIONS))
    opt = torch.optim.AdamW(list(vision.parameters()) + list(blocks.parameters()) + list(moves.parameters()),
                            lr=lr, betas=(0.9, 0.95))
    envs = {size: MazeEnv(size=size, cell_px=arch.cell_px) for size in maze_sizes}
    rng = np.random.default_rng(seed)
    acc = {"blocks": [], "nine_or_ten": [], "maze_moves": []}
    half = batch // 2
    bar = tqdm(range(steps), desc="SFT stage C0 (block perception)", unit="step")
    for step in bar:
        first = BLOCK_SEEDS + step * batch
        images, labels = block_pictures(first, half, arch.cell_px)
        maze_images, mazes = maze_pictures(envs, maze_sizes, first + half, batch - half, rng)
        enc = processor.image_processor(images=images + maze_images, return_tensors="pt")
        features = vision(enc["pixel_values"], grid_thw=enc["image_grid_thw"]).pooler_output
        ids = torch.tensor(np.concatenate(labels))
        target = torch.tensor(np.concatenate([direction_field(env.maze, env.target).reshape(-1) for env in mazes]))
        guess_ids, guess_moves = blocks(features[:len(ids)]), moves(features[len(ids):])
        loss = (torch.nn.functional.cross_entropy(guess_ids, ids, ignore_index=-1)
                + torch.nn.functional.cross_entropy(guess_moves, target, ignore_index=-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            right, twins = guess_ids.argmax(-1) == ids, (ids == 9) | (ids == 10)
            acc["blocks"].append(float(right[ids >= 0].float().mean()))
            acc["nine_or_ten"].append(float(right[twins].float().mean()))
            acc["maze_moves"].append(float((guess_moves.argmax(-1) == target)[target >= 0].float().mean()))
        if step % 50 == 0:
            bar.set_postfix({k: f"{np.mean(v[-50:]):.3f}" for k, v in acc.items()})
    return {k: round(float(np.mean(v[-100:])), 4) for k, v in acc.items()}


def expert_turns(task: Environment, env, prompter: ChatPrompter, window: int, pictures: int,
                 rng: random.Random, eps: float):
    """One expert episode as training sequences: each turn's exact rollout prompt + the expert's answer."""
    users, answers, images, seqs = [""], [], [env.render()], []
    for _ in range(env.max_turns):
        answer = task.expert_answer(env)
        prompt, picture_turns = prompter.prompt(users, answers, window, pictures)
        target = prompter.answer_ids(answer)
        seqs.append(TrainSeq("sft", prompt + target, [0] * len(prompt) + [1] * len(target),
                             [0.0] * (len(prompt) + len(target)), [images[i] for i in picture_turns]))
        if env.parse(answer) == "stop":
            break
        executed = task.random_answer(env, rng) if rng.random() < eps else answer  # noise: executed, never a target
        image, _, _, truncated, info = env.step(executed)
        if truncated:
            break
        answers.append(prompter.answer_ids(executed))
        users.append(info["feedback"])
        images.append(image)
    return seqs


@dataclass
class Source:
    """One task of a supervised stage: its config (environment, chat format), its share of each
    batch (0: validated only, to watch what the stage does to it), the validation solve rate that
    ends the stage (None: reported, never a stop rule), and `teacher`: a frozen model whose answer
    distributions this task's turns are pulled towards (KL) instead of the expert's answers, so
    the stage keeps what the model did on it rather than teaching it more."""
    cfg: object
    share: float = 1.0
    stop_at: float | None = None
    teacher: object = None
    task: Environment = field(init=False)
    prompter: ChatPrompter = field(init=False)

    def setup(self, processor):
        self.task = environment_of(self.cfg)
        self.prompter = task_prompter(processor, self.task, self.cfg.environment.cell_px)
        self.env = self.task.make_env(self.cfg.environment.cell_px, self.cfg.generator.max_turns)
        self.pool, self.next_seed = [], SFT_SEEDS
        return self

    def fill(self, want: int, rng: random.Random, eps: float) -> None:
        g = self.cfg.generator
        while len(self.pool) < want:
            self.env.reset(seed=self.next_seed)
            self.next_seed += 1
            self.pool += expert_turns(self.task, self.env, self.prompter, g.context_window_turns,
                                      g.context_pictures, rng, eps)


def validation_solve_rate(model, processor, source: Source) -> float:
    """Greedy solve rate on 64 validation instances (their own seeds: not the eval set)."""
    from actors.env_pool import EnvPool
    from inference.hf_backend import HFBackend
    from inference.requests import Sampling
    from rl.rollout import RolloutRunner, Task

    cfg, task = source.cfg, source.task
    g = cfg.generator
    rows = task.make_rows(VALIDATION_SEEDS, 64, g.max_turns)
    model.eval()
    runner = RolloutRunner.from_config(cfg, HFBackend(model, processor).generate, {task.name: source.prompter},
                                       EnvPool(task.name, cfg.environment.cell_px, g.max_turns))
    episodes = runner.run([Task(f"val{i}", i, task.init_state(r), env_id=task.name) for i, r in enumerate(rows)],
                          Sampling(max_new_tokens=g.eval_sampling_params.max_generate_length, temperature=0.0), 0)
    model.train()
    return sum(ep.solved for ep in episodes) / len(episodes)


def agent_stage(model, processor, sources: list[Source], max_steps: int, batch: int, lr: float, seed: int,
                check_every: int = 20, eps: float = 0.2, desc: str = "SFT stage B (agent)") -> dict:
    """SFT on expert turns in the rollout format, each batch split between the sources by share,
    stopped at the first validation check where every source with a `stop_at` reaches it; returns
    where it stopped, the checks (step, then each source's validation solve rate) and the
    answer-token accuracy."""
    sources = [s.setup(processor) for s in sources]
    gating = [k for k, s in enumerate(sources) if s.stop_at is not None]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95))
    rng = random.Random(seed)
    accs, checks = [], []
    bar = tqdm(range(1, max_steps + 1), desc=desc, unit="step")
    for step in bar:
        loss, correct = 0.0, []
        for s in sources:
            if not s.share:
                continue
            n = round(s.share * batch)
            s.fill(4 * n, rng, eps)
            rng.shuffle(s.pool)
            chunk, s.pool = s.pool[:n], s.pool[n:]
            inputs = collate(chunk, processor, "cpu")
            logp, logp_all = sampled_logprobs(model, inputs, with_distribution=True)
            if s.teacher is None:
                loss = loss - logp.mean()
                with torch.no_grad():  # the answer token is the model's top choice
                    correct.append(logp >= logp_all.max(-1).values - 1e-6)
            else:
                with torch.no_grad():
                    target = sampled_logprobs(s.teacher, inputs, with_distribution=True)[1]
                loss = loss + (target.exp() * (target - logp_all)).sum(-1).mean()  # KL(teacher || model)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        accs.append(float(torch.cat(correct).float().mean()))
        # every step once any gating source gets solved
        if step % check_every == 0 or (checks and any(checks[-1][1 + k] > 0 for k in gating)):
            rates = [validation_solve_rate(model, processor, s) for s in sources]
            checks.append((step, *rates))
            bar.set_postfix(loss=f"{loss.item():.3f}", tok_acc=f"{np.mean(accs[-20:]):.3f}",
                            val_solve="/".join(f"{r:.3f}" for r in rates))
            if all(rates[k] >= sources[k].stop_at for k in gating):
                break
    return {"agent_steps": step, "validation_checks": checks,
            "agent_answer_token_accuracy": float(np.mean(accs[-check_every:]))}


def greedy_solve_rate(folder: str, overrides: list[str], config: str | None = None) -> dict:
    """The shipped model on a config's eval set (the default's unless given), through the same path
    as --eval-only."""
    from actors.local import evaluate_locally
    from rl.inputs import load_datasets
    from settings import load_config
    run_dir = f"runs/sft-eval/{Path(config).stem if config else 'default'}"
    cfg = load_config(config, list(overrides) + [f"trainer.policy.model.path={folder}", f"trainer.run_dir={run_dir}",
                                                 f"data.dataset_dir={run_dir}/data"])
    return evaluate_locally(cfg, load_datasets(cfg)[1]).summary()


def stages_a_to_b(model, processor, arch, cfg, args) -> dict:
    """Perception (A), the agent's cell (A2), the maze agent (B); returns what each measured."""
    cache = Path(args.perception_cache) if args.perception_cache else None
    if cache is not None and (cache / "model.safetensors").exists():
        load_model(model, str(cache / "model.safetensors"))
        cell_acc = json.loads((cache / "perception.json").read_text())["cell_accuracy"]
    else:
        model.train()
        cell_acc = perception_stage(model, processor, arch, args.perception_steps, 32, 1e-3, args.seed,
                                    tuple(args.perception_sizes))
        if cache is not None:
            cache.mkdir(parents=True, exist_ok=True)
            save_model(model, str(cache / "model.safetensors"))
            (cache / "perception.json").write_text(json.dumps({"cell_accuracy": cell_acc, "sizes": args.perception_sizes,
                                                               "steps": args.perception_steps, "seed": args.seed}))
    torch.manual_seed(args.seed + 2)
    model.train()
    if args.locate_steps:
        perception_stage(model, processor, arch, args.locate_steps, 32, 1e-3, args.seed, tuple(args.perception_sizes),
                         locate=True, first_seed=LOCATE_SEEDS)
    torch.manual_seed(args.seed + 1)
    model.train()
    agent = agent_stage(model, processor, [Source(cfg, stop_at=args.stop_at)], args.agent_max_steps, 64, 1e-3,
                        args.seed, check_every=args.check_every)
    return {"perception_steps": args.perception_steps, "perception_sizes": args.perception_sizes,
            "perception_cell_accuracy": cell_acc,
            "locate_steps": args.locate_steps, **agent}


def main(argv=None):
    from settings import load_config
    from settings.load import parse_with_overrides

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="assets/maze-vl-base")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--perception-steps", type=int, default=3000)
    ap.add_argument("--perception-sizes", type=int, nargs="+", default=[9, 11], metavar="N",
                    help="stages A and A2: maze sizes of the pictures, in turn within a batch")
    ap.add_argument("--locate-steps", type=int, default=400, help="stage A2: perception plus the agent's cell")
    ap.add_argument("--agent-max-steps", type=int, default=1500)
    ap.add_argument("--check-every", type=int, default=5, help="stage B steps between validation checks")
    ap.add_argument("--stop-at", type=float, default=0.45, help="stop stage B once validation solve rate >= this")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--block-perception-steps", type=int, default=0,
                    help="stage C0 before stage C: the tower learns the sliding blocks' ids (0: skipped, as the "
                         "shipped base was built)")
    ap.add_argument("--second-task", default="configs/sliding_block.yaml", metavar="CONFIG",
                    help="stage C teaches this config's task ('' skips stage C)")
    ap.add_argument("--second-stop-at", type=float, default=0.4,
                    help="stop stage C once the second task's validation solve rate >= this")
    ap.add_argument("--second-max-steps", type=int, default=1500)
    ap.add_argument("--second-lr", type=float, default=5e-4)
    ap.add_argument("--keep-share", type=float, default=0.5,
                    help="stage C: the share of each batch that holds the maze where stage B left it")
    ap.add_argument("--from-base", metavar="DIR",
                    help="start stage C from this model (stages A to B done; a rebuild reproduces the shipped base)")
    ap.add_argument("--perception-cache", metavar="DIR",
                    help="reuse (or save) the model after stage A here: iterate on stage B without redoing A")
    ap.add_argument("overrides", nargs="*", help="config overrides; the chat format (context window, pictures, "
                                                 "max_turns) comes from configs/default.yaml, the task is "
                                                 "maze_2d/easy unless one names another")
    args = parse_with_overrides(ap, argv)
    # the shipped base learned VisGym's own picture; the trail the default trains on is RL's (configs/default.yaml)
    args.overrides = ["environment.env_class=maze_2d/easy", *args.overrides]
    cfg = load_config(None, args.overrides)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    started = time.time()
    arch = EmbeddedArch(cell_px=cfg.environment.cell_px)
    model, processor = build_random_base(arch, args.seed, tokenizer_corpus())
    if args.from_base:
        load_model(model, str(Path(args.from_base) / "model.safetensors"))  # handles the tied embeddings
        report = {"from_base": args.from_base}
    else:
        report = stages_a_to_b(model, processor, arch, cfg, args)
    # the maze's turns of stage C keep the stage-B model's own answers (KL to a frozen copy, taken
    # before C0 moves the tower): taught only the second task, the maze validation solve rate fell
    # from 45% to 0 within 10 steps
    teacher = copy.deepcopy(model).eval().requires_grad_(False) if args.second_task else None
    if args.block_perception_steps:
        torch.manual_seed(args.seed + 4)
        model.train()
        report["block_perception"] = {"steps": args.block_perception_steps, **block_perception_stage(
            model, processor, arch, args.block_perception_steps, 32, 1e-3, args.seed + 4, tuple(args.perception_sizes))}
    if args.second_task:
        torch.manual_seed(args.seed + 3)
        model.train()
        second = load_config(args.second_task, [])
        sources = [Source(second, share=1 - args.keep_share, stop_at=args.second_stop_at),
                   Source(cfg, share=args.keep_share, teacher=teacher)]
        stage_c = agent_stage(model, processor, sources,
                              args.second_max_steps, 64, args.second_lr, args.seed + 3, check_every=args.check_every,
                              desc=f"SFT stage C ({second.environment.env_class})")
        report["stage_c"] = {"env_class": second.environment.env_class, "stop_at": args.second_stop_at,
                             "lr": args.second_lr, **stage_c}
    model.eval()
    out = Path(args.out)
    tmp = temp_beside(out)
    model.save_pretrained(tmp)
    processor.save_pretrained(tmp)
    g = cfg.generator
    report = {"seed": args.seed, "arch": asdict(arch), "params": sum(p.numel() for p in model.parameters()),
              **report, "chat_format": {"context_window_turns": g.context_window_turns, "context_pictures": g.context_pictures,
                              "max_turns": g.max_turns},
              "sft_wall_s": round(time.time() - started, 1)}
    (tmp / "sft_report.json").write_text(json.dumps(report, indent=2))
    replace_dir(tmp, out)
    report["eval"] = greedy_solve_rate(str(out), args.overrides)
    if args.second_task:
        report["stage_c"]["eval"] = greedy_solve_rate(str(out), [], args.second_task)
    (out / "sft_report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
