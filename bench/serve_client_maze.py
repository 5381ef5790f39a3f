"""Play the eval mazes through a running serve app and compare with the eval harness.

    serve run serve_app:app dynamic_lora_loading_path=runs/default/exports &
    python bench/serve_client_maze.py --model maze-vl-base:global_step_64 \
        --adapter runs/default/exports/global_step_64/policy
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main():
    from actors.local import evaluate_locally
    from rl.inputs import load_datasets
    from serving.maze_client import openai_chat, play_as_configured
    from settings import load_config

    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--model", required=True, help="<base_id> or <base_id>:<adapter>")
    ap.add_argument("--adapter", help="the same adapter as a folder, for the eval harness side")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    cfg = load_config(None, args.overrides)
    _, rows = load_datasets(cfg)
    chat = openai_chat(args.url)
    served = [play_as_configured(chat, args.model, r, cfg) for r in rows]
    rate = sum(r["solved"] for r in served) / len(served)
    print(f"through the API: solve rate {100 * rate:.1f}% ({sum(r['solved'] for r in served)}/{len(served)})")
    report = evaluate_locally(cfg, rows, args.adapter)
    same = sum(a["answers"] == b["answers"] for a, b in zip(served, report.per_row))
    print(f"eval harness:    {report.line()}")
    print(f"identical move sequences: {same}/{len(rows)}")


if __name__ == "__main__":
    main()
