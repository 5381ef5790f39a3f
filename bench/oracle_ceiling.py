"""The BFS expert's solve rate (the oracle ceiling) by maze kind and step limit.

    python bench/oracle_ceiling.py [--seeds 2000]

Without the filter the ceiling is the share of seeds whose optimal route fits in max_turns
(moves + the final stop); with `data.solvable_only` the dataset keeps only those seeds, so the
ceiling on the filtered set is 100% by construction, and what the filter costs is the number of
seeds it skips.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from envs.maze import SIZES, MazeEnv  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=2000)
    args = ap.parse_args()
    print("| env | max_turns | unfiltered ceiling | filtered ceiling | seeds kept by filter |")
    print("|---|---|---|---|---|")
    for env_id, size in SIZES.items():
        env = MazeEnv(size=size, cell_px=4)
        moves = []
        for seed in range(args.seeds):
            env.reset(seed=seed)
            moves.append(env.optimal_moves())
        for turns in (15, 20):
            ok = sum(m + 1 <= turns for m in moves)
            filtered = "100.0%" if ok else "n/a (no seed fits)"
            print(f"| {env_id} | {turns} | {100 * ok / len(moves):.1f}% | {filtered} | {ok}/{len(moves)} |")


if __name__ == "__main__":
    main()
