"""What a policy gets wrong: replay an eval's per-maze answers and sort every turn.

    python tools/failure_modes.py runs/default/eval/step_00000.jsonl [--data runs/default/data/eval.jsonl]

Each turn is `optimal` (a shortest-path move, or stop on the goal), a `detour` (a move into an
open cell away from the goal), a `wall` hit (the agent stays put) or a wrong `stop`. Prints one
JSON line: turn counts, how many wrong turns repeat the previous move, the first error of each
failed maze, and the solve rate by the maze's optimal length; then one line a failed maze: its
first error (turn, kind, and for a detour the open cells behind it, which a turn into them can
cost twice over) and whether it ends pacing between two cells.
"""
import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main():
    from envs.actions import parse_action
    from envs.dataset import init_state
    from envs.expert import branch_size
    from envs.maze import MAZE_IDS, MazeEnv
    from envs.rows import load_rows

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("per_maze", help="an eval JSONL (runs/<run>/eval/step_N.jsonl or eval_only.jsonl)")
    ap.add_argument("--data", default="runs/default/data/eval.jsonl", help="the eval set those mazes come from")
    args = ap.parse_args()
    rows = {row["seed"]: row for row in load_rows(args.data)}
    turns, repeats, first_error, by_length = Counter(), Counter(), Counter(), Counter()
    failed = []
    for line in Path(args.per_maze).read_text().splitlines():
        record = json.loads(line)
        row = rows[record["seed"]]
        env = MazeEnv(MAZE_IDS[row["env_id"]][0], max_turns=len(record["answers"]) or 1)
        env.reset(options={"init_state": init_state(row)})
        previous, errors, cells, first = None, [], [], None
        for turn, answer in enumerate(record["answers"], 1):
            action, before, junction = parse_action(answer), env.optimal_moves(), env.agent
            _, _, _, _, info = env.step(action)
            cells.append(env.agent)
            if action == "stop":
                kind = "optimal" if before == 0 else "stop"
            elif action is None:
                kind = "invalid"
            elif info["feedback"].startswith("Cannot"):
                kind = "wall"
            else:
                kind = "optimal" if env.optimal_moves() < before else "detour"
            turns[kind] += 1
            if kind != "optimal":
                if not errors:
                    first = f"turn {turn}: {kind}" + (f" into {branch_size(env.maze, junction, env.agent)} open cells"
                                                      if kind == "detour" else "")
                errors.append(kind)
                repeats[kind] += action == previous
            previous = action
        by_length[(row["optimal_moves"], record["solved"])] += 1
        if not record["solved"]:
            first_error[errors[0] if errors else "none (ran out of turns)"] += 1
            failed.append(f"{record['seed']} ({row['optimal_moves']} moves, {len(record['answers'])} turns): "
                          f"{first or 'no error, ran out of turns'}"
                          + ("; ends pacing between two cells" if len(set(cells[-6:])) == 2 else ""))
    lengths = sorted({n for n, _ in by_length})
    print(json.dumps({"turns": dict(turns), "wrong_turns_repeating_previous_move": dict(repeats),
                      "first_error_of_failed_mazes": dict(first_error),
                      "solved_by_optimal_length": {n: f"{by_length[(n, True)]}/{by_length[(n, True)] + by_length[(n, False)]}"
                                                   for n in lengths}}))
    print("\n".join(failed))


if __name__ == "__main__":
    main()
