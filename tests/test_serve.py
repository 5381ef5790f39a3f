"""The serve app over real HTTP on 127.0.0.1: models, chat with images, adapters (local and S3),
LRU eviction, the official openai client, and bad requests that never take the server down."""
import json
import shutil
import socket

import numpy as np
import pytest
import requests

from serving.maze_client import data_url
from tests.conftest import make_adapter
from tests.test_e2e import ROOT


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def png_data_url(seed=0, side=144, noise=True):
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 255, (side, side, 3), dtype=np.uint8) if noise else np.full((side, side, 3), 200, np.uint8)
    return data_url(img)


def chat_body(model, image=True, **kw):
    content = [{"type": "text", "text": "Where next?"}]
    if image:
        content.append({"type": "image_url", "image_url": {"url": png_data_url()}})
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 6, "temperature": 0,
            **kw}


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    make_adapter(tiny_model_dir, root / "alpha", seed=1, scale=30.0)
    make_adapter(tiny_model_dir, root / "beta", seed=2, scale=30.0)
    make_adapter(tiny_model_dir, root / "toolarge", seed=3, rank=8)
    export = root / "global_step_7" / "policy"  # a training run's export layout
    shutil.copytree(root / "alpha", export)
    return root


@pytest.fixture(scope="module")
def server(tiny_model_dir, adapters, tmp_path_factory):
    import ray
    from ray import serve

    from serve_app import app
    port = free_port()
    ray.init(namespace="visrl-serve-test", include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    cache = tmp_path_factory.mktemp("cache")
    serve.run(app({"base_model": tiny_model_dir, "dynamic_lora_loading_path": str(adapters), "max_loras": "1",
                   "max_lora_rank": "4", "cache_dir": str(cache), "max_body_bytes": str(2_000_000)}),
              name="main", route_prefix="/", blocking=False)
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()


def post(server, body, **kw):
    return requests.post(f"{server}/v1/chat/completions", json=body, timeout=120, **kw)


def test_models_lists_base_and_every_adapter(server, tiny_model_dir):
    base = tiny_model_dir.rstrip("/").split("/")[-1]
    ids = {m["id"] for m in requests.get(f"{server}/v1/models", timeout=30).json()["data"]}
    assert ids == {base, f"{base}:alpha", f"{base}:beta", f"{base}:toolarge", f"{base}:global_step_7"}
    assert requests.get(f"{server}/health", timeout=30).status_code == 200


def test_chat_for_base_and_two_adapters_with_an_image(server, tiny_model_dir):
    base = tiny_model_dir.rstrip("/").split("/")[-1]
    outs = {}
    for model in (base, f"{base}:alpha", f"{base}:beta"):
        r = post(server, chat_body(model))
        assert r.status_code == 200, r.text
        data = r.json()
        assert data["object"] == "chat.completion" and data["model"] == model
        assert data["usage"]["prompt_tokens"] > 81 and data["usage"]["completion_tokens"] >= 1
        outs[model] = data["choices"][0]["message"]["content"]
    assert len(set(outs.values())) == 3, outs  # different adapters, different answers
    # the export layout serves the same weights as the adapter it was copied from
    same = post(server, chat_body(f"{base}:global_step_7")).json()["choices"][0]["message"]["content"]
    assert same == outs[f"{base}:alpha"]


def test_lru_eviction_and_reload_with_max_loras_1(server, tiny_model_dir):
    base = tiny_model_dir.rstrip("/").split("/")[-1]
    for model in (f"{base}:alpha", f"{base}:beta", f"{base}:alpha"):
        assert post(server, chat_body(model)).status_code == 200
    stats = requests.get(f"{server}/v1/adapters/stats", timeout=30).json()
    assert stats["resident"] == ["alpha"] and stats["evictions"] >= 2


def test_concurrent_first_requests_load_once(server, tiny_model_dir):
    from concurrent.futures import ThreadPoolExecutor
    base = tiny_model_dir.rstrip("/").split("/")[-1]
    before = requests.get(f"{server}/v1/adapters/stats", timeout=30).json()
    post(server, chat_body(f"{base}:alpha"))  # make alpha resident, so beta is a cold load below
    misses0 = requests.get(f"{server}/v1/adapters/stats", timeout=30).json()["misses"]
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: post(server, chat_body(f"{base}:beta")).status_code, range(8)))
    after = requests.get(f"{server}/v1/adapters/stats", timeout=30).json()
    assert codes == [200] * 8 and after["misses"] == misses0 + 1 and before["misses"] <= misses0


def test_openai_client(server, tiny_model_dir):
    from openai import OpenAI
    base = tiny_model_dir.rstrip("/").split("/")[-1]
    client = OpenAI(base_url=f"{server}/v1", api_key="unused")
    assert f"{base}:alpha" in [m.id for m in client.models.list()]
    resp = client.chat.completions.create(model=f"{base}:alpha", max_tokens=4, temperature=0, n=2, messages=[
        {"role": "user", "content": [{"type": "text", "text": "hi"},
                                     {"type": "image_url", "image_url": {"url": png_data_url(1)}}]}])
    assert len(resp.choices) == 2 and resp.usage.completion_tokens >= 2
    with pytest.raises(Exception) as e:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert "404" in str(e.value) or "does not exist" in str(e.value)


BAD = [
    ("not json", {"data": b"{nope"}, 400, "not valid JSON"),
    ("no model", {"json": {"messages": [{"role": "user", "content": "hi"}]}}, 400, "'model'"),
    ("no messages", {"json": {"model": "BASE"}}, 400, "'messages'"),
    ("bad role", {"json": {"model": "BASE", "messages": [{"role": "wizard", "content": "hi"}]}}, 400, "role"),
    ("bad content", {"json": {"model": "BASE", "messages": [{"role": "user", "content": 5}]}}, 400, "content"),
    ("temperature type", {"json": {**chat_body("BASE", image=False), "temperature": "hot"}}, 400, "temperature"),
    ("max_tokens range", {"json": {**chat_body("BASE", image=False), "max_tokens": 10**6}}, 400, "max_tokens"),
    ("max_tokens zero", {"json": {**chat_body("BASE", image=False), "max_tokens": 0}}, 400, "max_tokens"),
    ("n range", {"json": {**chat_body("BASE", image=False), "n": 99}}, 400, "'n'"),
    ("non-image data url", {"json": {"model": "BASE", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGVsbG8="}}]}]}}, 400, "base64 image"),
    ("broken image", {"json": {"model": "BASE", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}]}]}}, 400, "readable image"),
    ("remote url", {"json": {"model": "BASE", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://169.254.169.254/x.png"}}]}]}}, 400, "data URL"),
    ("oversized image", {"json": {"model": "BASE", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": png_data_url(side=1100, noise=False)}}]}]}}, 413, "pixels"),
    ("oversized body", {"data": b"x" * 2_100_000, "headers": {"content-type": "application/json"}}, 413, "bytes"),
    ("unknown model", {"json": chat_body("gpt-5", image=False)}, 404, "/v1/models"),
    ("unknown adapter", {"json": chat_body("BASE:ghost", image=False)}, 404, "not found"),
    ("path traversal", {"json": chat_body("BASE:../../etc", image=False)}, 400, "invalid adapter name"),
    ("absolute path", {"json": chat_body("BASE:/etc/passwd", image=False)}, 400, "invalid adapter name"),
    ("rank too large", {"json": chat_body("BASE:toolarge", image=False)}, 400, "max_lora_rank"),
]


@pytest.mark.parametrize("name, kwargs, status, words", BAD, ids=[b[0] for b in BAD])
def test_bad_requests_get_clear_errors_and_the_server_stays_up(server, tiny_model_dir, name, kwargs, status, words):
    base = tiny_model_dir.rstrip("/").split("/")[-1]
    kwargs = json.loads(json.dumps(kwargs, default=lambda b: b.decode("latin1")).replace("BASE", base)) \
        if "json" in kwargs else kwargs
    r = requests.post(f"{server}/v1/chat/completions", timeout=120, **kwargs)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]["message"]
    ok = post(server, chat_body(base))
    assert ok.status_code == 200


def test_adapters_from_a_local_s3_server(server, tiny_model_dir, adapters, s3_server, tmp_path):
    """A second app, beside the first, reading adapters from s3:// on moto's S3 server."""
    from ray import serve

    from serve_app import app
    client = s3_server.client()
    client.create_bucket(Bucket="adapters")
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        client.upload_file(str(adapters / "beta" / f), "adapters", f"prod/beta/{f}")
    base = tiny_model_dir.rstrip("/").split("/")[-1]
    serve.run(app({"base_model": tiny_model_dir, "dynamic_lora_loading_path": "s3://adapters/prod",
                   "s3_endpoint_url": s3_server.url, "cache_dir": str(tmp_path / "cache"), "max_loras": "2"}),
              name="s3app", route_prefix="/s3", blocking=False)
    ids = [m["id"] for m in requests.get(f"{server}/s3/v1/models", timeout=30).json()["data"]]
    assert ids == [base, f"{base}:beta"]
    from_s3 = post(f"{server}/s3", chat_body(f"{base}:beta"))
    assert from_s3.status_code == 200, from_s3.text
    local = post(server, chat_body(f"{base}:beta"))
    assert from_s3.json()["choices"][0]["message"]["content"] == local.json()["choices"][0]["message"]["content"]
    stats = requests.get(f"{server}/s3/v1/adapters/stats", timeout=30).json()
    assert stats["resident"] == ["beta"] and stats["load_seconds"]["beta"] > 0
    serve.delete("s3app")


def test_a_maze_played_through_the_api_makes_the_eval_harness_moves(server, tmp_path):
    """The served agent and the eval harness see the same chat, so greedy answers match move for move.
    The shipped base plays (a random tiny model's garbage text does not survive a text round trip)."""
    from ray import serve

    from actors.local import evaluate_locally
    from rl.inputs import load_datasets
    from serve_app import app
    from serving.maze_client import openai_chat, play
    from settings import load_config
    base = str(ROOT / "assets" / "maze-vl-base")
    serve.run(app({"base_model": base, "cache_dir": str(tmp_path / "cache")}), name="maze", route_prefix="/maze",
              blocking=False)
    cfg = load_config(None, [f"trainer.run_dir={tmp_path}", f"data.dataset_dir={tmp_path}/data", "data.eval_size=6"])
    _, rows = load_datasets(cfg)
    harness = evaluate_locally(cfg, rows)
    g = cfg.generator
    chat = openai_chat(f"{server}/maze/v1")
    played = [play(chat, "maze-vl-base", row, cfg.environment.cell_px, g.max_turns, g.context_window_turns,
                   g.context_pictures, g.eval_sampling_params.max_generate_length) for row in rows]
    serve.delete("maze")
    assert [p["answers"] for p in played] == [m["answers"] for m in harness.per_maze]
    assert [p["solved"] for p in played] == [m["solved"] for m in harness.per_maze]
