"""serve_app with backend=vllm: ray.serve.llm on vLLM's CPU build, adapters from a local S3 server
(moto), driven with the official openai client beside the hf server of the same settings."""
import json

import pytest

from net import free_port
from serving.maze_client import messages_for, openai_chat, play_as_configured
from settings import load_config
from tests.helpers import EMBEDDED_BASE as BASE
from tests.helpers import make_adapter, run_driver, run_tool, short_run_args

BASE_ID = "maze-vl-base"


@pytest.fixture(scope="module")
def published(s3_server, tmp_path_factory):
    """A short CPU training run's validation-best adapter, published to the S3 server as `stage1` by
    `tools/publish.py`, and `driver.py --eval-only`'s episodes of it: (the run's arguments, those episodes)."""
    run = tmp_path_factory.mktemp("published") / "run"
    args = short_run_args(run)
    trained = run_driver(args)
    assert trained.returncode == 0, trained.stderr[-3000:]
    s3_server.client().create_bucket(Bucket="serve")
    out = run_tool("publish", ["stage1", "--to", "s3://serve/adapters", *args, f"s3.endpoint_url={s3_server.url}"])
    assert out.returncode == 0, out.stderr[-3000:]
    evaluated = run_driver(["--eval-only", "--adapter", str(run / "exports" / "best" / "policy"), *args[1:],
                            f"trainer.run_dir={run.parent / 'eval'}"])
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    return args, [json.loads(line) for line in (run.parent / "eval" / "eval_only.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def servers(s3_server, published, tmp_path_factory):
    """Both apps in one Ray cluster: the hf server at /hf, ray.serve.llm at /vllm."""
    import ray
    from ray import serve

    from serve_app import app
    folder = tmp_path_factory.mktemp("adapters") / "alpha"
    # strong enough to change every first answer of the base (the base answers confidently: at 0.35
    # it changed none, at 0.5 half of them, near ties); the two servers must still agree on each
    make_adapter(BASE, folder, seed=1, rank=8, scale=0.7)
    s3 = s3_server.client()
    for f in folder.iterdir():
        s3.upload_file(str(f), "serve", f"adapters/alpha/{f.name}")
    port = free_port()
    # ray.serve.llm's router, its server replica and the engine's CPU bundle each take logical CPUs:
    # with 2 it waited forever to deploy on a 2-core machine
    ray.init(namespace="visrl-vllm-serve-test", include_dashboard=False, num_cpus=8)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    common = {"base_model": BASE, "dynamic_lora_loading_path": "s3://serve/adapters", "s3_endpoint_url": s3_server.url,
              "max_loras": "2", "max_lora_rank": "16", "num_cpus": "2"}
    serve.run(app({**common, "cache_dir": str(tmp_path_factory.mktemp("cache"))}), name="hf", route_prefix="/hf")
    serve.run(app({**common, "backend": "vllm"}), name="vllm", route_prefix="/vllm")
    url = f"http://127.0.0.1:{port}"
    yield {"hf": f"{url}/hf/v1", "vllm": f"{url}/vllm/v1"}
    serve.shutdown()
    ray.shutdown()


def client(base_url):
    from openai import OpenAI
    return OpenAI(base_url=base_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def cfg_and_rows(tmp_path_factory):
    from rl.inputs import load_datasets
    cfg = load_config(None, [f"data.dataset_dir={tmp_path_factory.mktemp('data')}", "data.eval_size=8",
                             "data.train_size=8", "trainer.train_batch_size=8"])
    return cfg, load_datasets(cfg)[1]


def picture_question(model, cfg, row):
    """An eval maze's first turn, as the agent sees it: the instruction and the picture."""
    from envs.dataset import init_state
    from envs.maze import MazeEnv
    image, _ = MazeEnv(size=len(row["maze"]), cell_px=cfg.environment.cell_px, max_turns=5).reset(
        options={"init_state": init_state(row)})
    return {"model": model, "max_tokens": 8, "temperature": 0, "messages": messages_for([""], [], [image], 2, 1)}


def test_models_and_picture_completions_on_base_and_adapter(servers, cfg_and_rows):
    import openai
    cfg, rows = cfg_and_rows
    vllm = client(servers["vllm"])
    assert BASE_ID in {m.id for m in vllm.models.list().data}
    answers = {}
    for model in (BASE_ID, f"{BASE_ID}:alpha"):
        for name, url in servers.items():
            replies = [client(url).chat.completions.create(**picture_question(model, cfg, row)) for row in rows]
            assert all(r.usage.prompt_tokens > 50 for r in replies)  # the picture's tokens reached the model
            answers[name, model] = [r.choices[0].message.content for r in replies]
        assert answers["vllm", model] == answers["hf", model]
    assert answers["vllm", BASE_ID] != answers["vllm", f"{BASE_ID}:alpha"]  # the adapter from S3 was applied
    with pytest.raises(openai.APIStatusError) as e:
        vllm.chat.completions.create(**picture_question(f"{BASE_ID}:no-such-adapter", cfg, rows[0]))
    assert 400 <= e.value.status_code < 500


def test_the_published_adapter_plays_as_eval_only_on_both_apps(servers, published):
    """From training to serving: what `tools/publish.py` put on S3, served by ray.serve.llm (and the
    hf app) as <base>:stage1, makes `driver.py --eval-only`'s greedy moves through the openai client."""
    from rl.inputs import load_datasets
    args, eval_only = published
    cfg = load_config(None, args)
    rows = load_datasets(cfg)[1]
    assert [r["seed"] for r in rows] == [e["seed"] for e in eval_only]
    for name, url in servers.items():
        played = [play_as_configured(openai_chat(url), f"{BASE_ID}:stage1", row, cfg) for row in rows]
        assert [p["answers"] for p in played] == [e["answers"] for e in eval_only], name


def test_greedy_maze_episodes_equal_the_hf_server(servers, cfg_and_rows):
    cfg, rows = cfg_and_rows
    for model in (BASE_ID, f"{BASE_ID}:alpha"):
        played = {name: [play_as_configured(openai_chat(url), model, row, cfg) for row in rows]
                  for name, url in servers.items()}
        assert sum(len(p["answers"]) for p in played["hf"]) > 2 * len(rows)
        assert played["vllm"] == played["hf"], model


def test_serve_bench_flags_are_the_engine_arguments_vllm_parses():
    """bench/serve_bench.py --backends vllm-server hands the serve app's engine arguments to vLLM's
    own server as command-line flags: vLLM's parser must read them back as the same values."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser  # vLLM 0.26: vllm.entrypoints.openai.cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from bench.serve_bench import cli_flags
    from inference.vllm_backend import engine_kwargs

    options = {"max_model_len": 4096, "dtype": "float32"} | engine_kwargs(True, 16, 4)
    parsed = vars(make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "m", *cli_flags(options)]))
    assert options["enable_chunked_prefill"] is False and options["enable_lora"] is True  # both kinds of flag
    assert {k: parsed[k] for k in options} == options
