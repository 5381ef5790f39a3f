"""How a sliding-block run did on the twin boards (envs.sliding_block.twin_boards: boards that look,
digits erased, like another layout as near the start) and on the rest: where a solve rate is lost
to reading the block ids rather than to planning.

    python bench/twin_boards.py EVAL_SET EPISODES [...]
    python bench/twin_boards.py EVAL_SET --first-moves MODEL [--adapter DIR]

EVAL_SET is the eval set's rows (their targets); EPISODES a run's per-episode eval records on it
(eval/step_*.jsonl, or heldout/eval_only.jsonl with the held-out set). With --first-moves, each twin
board's first turn is put to the model (and adapter) and the probability of every legal first move
printed beside its look-alikes': a policy that reads the digits gives twins different first moves.
"""
import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from envs.rows import load_rows  # noqa: E402
from envs.sliding_block import DIRECTIONS, SOLVED, legal_moves, shortest_moves, twin_boards, without_ids  # noqa: E402
from envs.sliding_block_task import move_text  # noqa: E402
from tools.seeds import read_jsonl  # noqa: E402


def targets(rows: list[dict]) -> list[dict]:
    return [{int(b): tuple(p) for b, p in r["target"].items()} for r in rows]


def split(rows: list[dict], episodes: list[dict]) -> dict:
    twin = dict(zip((r["seed"] for r in rows), twin_boards(targets(rows))))
    out = {}
    for name, keep in (("all", lambda s: True), ("twins", lambda s: twin[s]), ("others", lambda s: not twin[s])):
        chosen = [e["solved"] for e in episodes if keep(e["seed"])]
        out[name] = (sum(chosen), len(chosen))
    return out


def first_move_probabilities(model, processor, rows: list[dict], cfg) -> list[dict[str, float]]:
    """For each row's board, the model's probability of each legal first move (the whole answer,
    sampled at temperature 1) on the first turn's prompt, as the rollout builds it."""
    from rl.inputs import environment_of, task_prompter
    from vlm.forward import TrainSeq, collate, sampled_logprobs
    task = environment_of(cfg)
    env = task.make_env(cfg.environment.cell_px, cfg.generator.max_turns)
    prompter = task_prompter(processor, task, cfg.environment.cell_px)
    # every episode starts from the solved layout with one picture and no answers: one prompt for all
    prompt, _ = prompter.prompt([""], [], cfg.generator.context_window_turns, cfg.generator.context_pictures)
    answers = {move_text(*m): prompter.answer_ids(move_text(*m)) for m in legal_moves(dict(SOLVED))}
    out = []
    for row in rows:
        picture, _ = env.reset(options={"init_state": task.init_state(row)})
        seqs = [TrainSeq("first", prompt + ids, [0] * len(prompt) + [1] * len(ids), [0.0] * (len(prompt) + len(ids)),
                         [picture]) for ids in answers.values()]
        with torch.no_grad():
            logp, _ = sampled_logprobs(model, collate(seqs, processor, "cpu"))
        per_answer = torch.split(logp, [s.n_scored for s in seqs])
        out.append({text: float(np.exp(lp.sum().item())) for text, lp in zip(answers, per_answer)})
    return out


def show_first_moves(rows: list[dict], model_path: str, adapter: str | None) -> None:
    from settings import load_config
    from vlm.load import load_model
    model, processor = load_model(model_path, speedups=False)
    if adapter:
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload().eval()
    cfg = load_config("configs/sliding_block.yaml", [])
    boards = targets(rows)
    # one row a distinct twin board, look-alikes next to each other
    distinct = {tuple(sorted(b.items())): (b, r) for b, r, twin in zip(boards, rows, twin_boards(boards)) if twin}
    chosen = sorted(distinct.values(), key=lambda br: (without_ids(br[0]), len(shortest_moves(SOLVED, br[0]))))
    for (board, _), probs in zip(chosen, first_move_probabilities(model, processor, [r for _, r in chosen], cfg)):
        route = ", ".join(f"{b} {DIRECTIONS[d]}" for b, d in shortest_moves(SOLVED, board))
        best = sorted(probs.items(), key=lambda kv: -kv[1])[:4]
        print(f"{route:<34} " + "  ".join(f"{t[8:-9]}: {p:.3f}" for t, p in best))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("eval_set", help="the eval set's rows (JSON lines with seed and target)")
    ap.add_argument("episodes", nargs="*", help="a run's per-episode eval records on that set")
    ap.add_argument("--first-moves", metavar="MODEL", help="the model whose first moves on the twin boards to show")
    ap.add_argument("--adapter", help="a LoRA adapter folder, merged into --first-moves' model")
    args = ap.parse_args(argv)
    rows = load_rows(args.eval_set)
    for path in args.episodes:
        counts = split(rows, read_jsonl(Path(path)))
        print(path + ": " + ", ".join(f"{name} {solved}/{total}" for name, (solved, total) in counts.items()))
    if args.first_moves:
        torch.set_num_threads(2)
        show_first_moves(rows, args.first_moves, args.adapter)


if __name__ == "__main__":
    main()
