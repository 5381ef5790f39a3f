"""How a sliding-block run did on the twin boards (envs.sliding_block.twin_boards: boards that look,
digits erased, like another layout as near the start) and on the rest: where a solve rate is lost
to reading the block ids rather than to planning.

    python bench/twin_boards.py runs/seeds/sb128/seed_42/data/eval.jsonl runs/seeds/sb128/seed_42/eval/step_00128.jsonl [...]

The first file is the eval set (its rows' targets), the others a run's per-episode eval records on it
(eval/step_*.jsonl, or heldout/eval_only.jsonl with the held-out set).
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from envs.sliding_block import twin_boards  # noqa: E402


def read_jsonl(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def split(rows: list[dict], episodes: list[dict]) -> dict:
    twin = dict(zip((r["seed"] for r in rows),
                    twin_boards([{int(b): tuple(p) for b, p in r["target"].items()} for r in rows])))
    out = {}
    for name, keep in (("all", lambda s: True), ("twins", lambda s: twin[s]), ("others", lambda s: not twin[s])):
        chosen = [e["solved"] for e in episodes if keep(e["seed"])]
        out[name] = (sum(chosen), len(chosen))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("eval_set", help="the eval set's rows (JSON lines with seed and target)")
    ap.add_argument("episodes", nargs="+", help="a run's per-episode eval records on that set")
    args = ap.parse_args(argv)
    rows = read_jsonl(args.eval_set)
    for path in args.episodes:
        counts = split(rows, read_jsonl(path))
        print(path + ": " + ", ".join(f"{name} {solved}/{total}" for name, (solved, total) in counts.items()))


if __name__ == "__main__":
    main()
