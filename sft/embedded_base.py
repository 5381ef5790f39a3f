"""Build the embedded base model: random init, then supervised stages A, A2 and B, stopped short.

    python -m sft.embedded_base --out assets/maze-vl-base [--seed 0]

Stage A (perception) stands in for the vision pretraining a real VLM brings: the vision tower
plus a throw-away linear probe learn, for every cell of a maze picture, the BFS expert's move
from that cell (dense labels: 49 supervised cells a picture instead of one decision). Stage A2
(400 steps) keeps that and adds a second probe for which cell holds the disc: the agent's own
cell then stands out among the image tokens, and the language layers learn to read its move in
tens of steps instead of hundreds. Stage B is SFT of the whole model on BFS-expert episodes in
the exact chat format rollouts use (the same ChatPrompter, context window and answer format); 20%
of the executed moves are random and left out of the loss, so recovery states are seen. Stage B
stops at the first check (every 5 steps, every step once any maze is solved) whose greedy solve
rate on 64 validation mazes (their own seeds, not the eval set) reaches --stop-at (45%), so the
base lands between 30% and 55% on the eval set: RL has work to do.

Without stage A, SFT alone left this shape far from solving mazes (docs/embedded-base.md has
what each stage measured).

Everything is seeded (torch, the maze seeds, the move noise) and runs on fixed threads, so a
rebuild from the same seed reproduces the shipped model byte for byte.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from envs.actions import ACTIONS, MOVES
from envs.expert import direction_field, expert_actions
from envs.maze import MazeEnv
from envs.prompt import INSTRUCTION, action_text
from vlm.build import EmbeddedArch, build_random_base
from vlm.chat import ChatPrompter
from vlm.forward import TrainSeq, collate, sampled_logprobs

SFT_SEEDS = 10_000_000       # maze seeds for SFT: far from the train (0+) and eval (1,000,000+) sets
PROBE_SEEDS = 20_000_000
LOCATE_SEEDS = 25_000_000
VALIDATION_SEEDS = 30_000_000  # the SFT stop rule looks at these, never at the eval set


def perception_stage(model, processor, arch, steps: int, batch: int, lr: float, seed: int,
                     locate: bool = False, first_seed: int = PROBE_SEEDS) -> float:
    """Train the vision tower on per-cell expert moves; returns the final per-cell accuracy.

    With `locate`, a second probe also learns which cell holds the disc, so the agent's own cell
    stands out among the image tokens the language layers read."""
    vision = model.model.visual
    probe = torch.nn.Linear(arch.text_hidden, len(ACTIONS))
    params = list(vision.parameters()) + list(probe.parameters())
    if locate:  # made only here, so stage A draws exactly the random numbers it always did
        where = torch.nn.Linear(arch.text_hidden, 2)
        params += list(where.parameters())
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95))
    env = MazeEnv(size=arch.maze_size, cell_px=arch.cell_px)
    rng = np.random.default_rng(seed)
    accs = []
    bar = tqdm(range(steps), desc="SFT stage A2 (locate the agent)" if locate else "SFT stage A (perception)", unit="step")
    for step in bar:
        images, labels, agent_cells = [], [], []
        for k in range(batch):
            env.reset(seed=first_seed + step * batch + k)
            floor = np.argwhere(env.maze == 0)
            env.agent = tuple(int(v) for v in floor[rng.integers(len(floor))])  # the disc anywhere
            images.append(env.render())
            labels.append(direction_field(env.maze, env.target).reshape(-1))
            agent_cells.append(env.agent[0] * arch.maze_size + env.agent[1])
        enc = processor.image_processor(images=images, return_tensors="pt")
        target = torch.tensor(np.concatenate(labels))
        features = vision(enc["pixel_values"], grid_thw=enc["image_grid_thw"]).pooler_output
        logits = probe(features)
        loss = torch.nn.functional.cross_entropy(logits, target, ignore_index=-1)
        if locate:
            is_agent = torch.zeros(len(target), dtype=torch.long)
            is_agent[torch.arange(batch) * arch.maze_size ** 2 + torch.tensor(agent_cells)] = 1
            # one agent cell against 80 others: weight it up so the probe cannot ignore it
            loss = loss + torch.nn.functional.cross_entropy(where(features), is_agent, weight=torch.tensor([1.0, 10.0]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        known = target >= 0
        accs.append(((logits.argmax(-1) == target) & known).sum().item() / known.sum().item())
        if step % 50 == 0:
            bar.set_postfix(cell_acc=f"{np.mean(accs[-50:]):.3f}")
    return float(np.mean(accs[-100:]))


def expert_turns(env: MazeEnv, prompter: ChatPrompter, tok, window: int, pictures: int, rng: random.Random,
                 eps: float):
    """One expert episode as training sequences: each turn's exact rollout prompt + the expert's answer."""
    users, answers, images, seqs = [""], [], [env.render()], []
    for _ in range(env.max_turns):
        action = expert_actions(env.maze, env.agent, env.target)[0]
        prompt, picture_turns = prompter.prompt(users, answers, window, pictures)
        target = tok.encode(action_text(action), add_special_tokens=False) + [prompter.end_id]
        seqs.append(TrainSeq("sft", prompt + target, [0] * len(prompt) + [1] * len(target),
                             [0.0] * (len(prompt) + len(target)), [images[i] for i in picture_turns]))
        if action == "stop":
            break
        executed = rng.choice(MOVES) if rng.random() < eps else action  # noise: executed, never a target
        image, _, _, truncated, info = env.step(executed)
        if truncated:
            break
        answers.append(tok.encode(action_text(executed), add_special_tokens=False) + [prompter.end_id])
        users.append(info["feedback"])
        images.append(image)
    return seqs


def validation_solve_rate(model, processor, prompter, cfg) -> float:
    """Greedy solve rate on 64 validation mazes (their own seeds: not the eval set)."""
    from actors.env_pool import EnvPool
    from envs.dataset import init_state, make_rows
    from inference.hf_backend import HFBackend
    from inference.requests import Sampling
    from rl.rollout import RolloutRunner, Task

    g, env_id = cfg.generator, cfg.environment.env_class
    rows, _ = make_rows(env_id, VALIDATION_SEEDS, 64, g.max_turns, solvable_only=True)
    model.eval()
    runner = RolloutRunner.from_config(cfg, HFBackend(model, processor).generate, prompter,
                                       EnvPool(env_id, cfg.environment.cell_px, g.max_turns))
    episodes = runner.run([Task(f"val{i}", i, init_state(r)) for i, r in enumerate(rows)],
                          Sampling(max_new_tokens=8, temperature=0.0), 0)
    model.train()
    return sum(ep.solved for ep in episodes) / len(episodes)


def agent_stage(model, processor, arch, cfg, max_steps: int, batch: int, lr: float, seed: int, stop_at: float,
                check_every: int = 20, eps: float = 0.2) -> dict:
    """SFT on expert turns in the rollout format, stopped at the first validation check whose
    greedy solve rate reaches `stop_at`; returns where it stopped and the answer-token accuracy."""
    g = cfg.generator
    prompter = ChatPrompter(processor.tokenizer, arch.maze_size ** 2, INSTRUCTION)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95))
    env = MazeEnv(size=arch.maze_size, cell_px=arch.cell_px, max_turns=g.max_turns)
    rng = random.Random(seed)
    pool, next_seed, accs = [], SFT_SEEDS, []
    bar = tqdm(range(1, max_steps + 1), desc="SFT stage B (agent)", unit="step")
    checks = []
    for step in bar:
        while len(pool) < 4 * batch:
            env.reset(seed=next_seed)
            next_seed += 1
            pool += expert_turns(env, prompter, processor.tokenizer, g.context_window_turns, g.context_pictures,
                                 rng, eps)
        rng.shuffle(pool)
        chunk, pool = pool[:batch], pool[batch:]
        logp, logp_all = sampled_logprobs(model, collate(chunk, processor, "cpu"), with_distribution=True)
        loss = -logp.mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():  # the answer token is the model's top choice
            accs.append(float((logp >= logp_all.max(-1).values - 1e-6).float().mean()))
        if step % check_every == 0 or (checks and checks[-1][1] > 0):  # every step once mazes get solved
            rate = validation_solve_rate(model, processor, prompter, cfg)
            checks.append((step, rate))
            bar.set_postfix(loss=f"{loss.item():.3f}", tok_acc=f"{np.mean(accs[-20:]):.3f}", val_solve=f"{rate:.3f}")
            if rate >= stop_at:
                break
    return {"agent_steps": step, "validation_checks": checks,
            "agent_answer_token_accuracy": float(np.mean(accs[-check_every:]))}


def greedy_solve_rate(folder: str, overrides: list[str]) -> dict:
    """The shipped model on the default eval set, through the same path as --eval-only."""
    from actors.local import evaluate_locally
    from rl.inputs import load_datasets
    from settings import load_config
    cfg = load_config(None, list(overrides) + [f"trainer.policy.model.path={folder}", "trainer.run_dir=runs/sft-eval",
                                               "data.dataset_dir=runs/sft-eval/data"])
    return evaluate_locally(cfg, load_datasets(cfg)[1]).summary()


def main(argv=None):
    from settings import load_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="assets/maze-vl-base")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--perception-steps", type=int, default=3000)
    ap.add_argument("--locate-steps", type=int, default=400, help="stage A2: perception plus the agent's cell")
    ap.add_argument("--agent-max-steps", type=int, default=1500)
    ap.add_argument("--check-every", type=int, default=5, help="stage B steps between validation checks")
    ap.add_argument("--stop-at", type=float, default=0.45, help="stop stage B once validation solve rate >= this")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--perception-cache", metavar="DIR",
                    help="reuse (or save) the model after stage A here: iterate on stage B without redoing A")
    ap.add_argument("overrides", nargs="*", help="config overrides; the chat format (context window, pictures, "
                                                 "max_turns) comes from configs/default.yaml")
    args = ap.parse_args(argv)
    cfg = load_config(None, args.overrides)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    started = time.time()
    arch = EmbeddedArch(cell_px=cfg.environment.cell_px)
    model, processor = build_random_base(arch, args.seed)
    cache = Path(args.perception_cache) if args.perception_cache else None
    if cache is not None and (cache / "model.safetensors").exists():
        from safetensors.torch import load_model
        load_model(model, str(cache / "model.safetensors"))  # handles the tied embeddings
        cell_acc = json.loads((cache / "perception.json").read_text())["cell_accuracy"]
    else:
        model.train()
        cell_acc = perception_stage(model, processor, arch, args.perception_steps, 32, 1e-3, args.seed)
        if cache is not None:
            cache.mkdir(parents=True, exist_ok=True)
            from safetensors.torch import save_model
            save_model(model, str(cache / "model.safetensors"))
            (cache / "perception.json").write_text(json.dumps({"cell_accuracy": cell_acc,
                                                               "steps": args.perception_steps, "seed": args.seed}))
    torch.manual_seed(args.seed + 2)
    model.train()
    if args.locate_steps:
        perception_stage(model, processor, arch, args.locate_steps, 32, 1e-3, args.seed, locate=True,
                         first_seed=LOCATE_SEEDS)
    torch.manual_seed(args.seed + 1)
    model.train()
    agent = agent_stage(model, processor, arch, cfg, args.agent_max_steps, 64, 1e-3, args.seed, args.stop_at,
                        check_every=args.check_every)
    model.eval()
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    processor.save_pretrained(tmp)
    g = cfg.generator
    report = {"seed": args.seed, "arch": asdict(arch), "params": sum(p.numel() for p in model.parameters()),
              "perception_steps": args.perception_steps, "perception_cell_accuracy": cell_acc,
              "locate_steps": args.locate_steps, **agent,
              "chat_format": {"context_window_turns": g.context_window_turns, "context_pictures": g.context_pictures,
                              "max_turns": g.max_turns},
              "sft_wall_s": round(time.time() - started, 1)}
    (tmp / "sft_report.json").write_text(json.dumps(report, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    report["eval"] = greedy_solve_rate(str(out), args.overrides)
    (out / "sft_report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
