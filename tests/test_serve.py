"""The serve app over real HTTP on 127.0.0.1: models, chat with images, adapters (local and S3),
LRU eviction, the official openai client, and bad requests that never take the server down."""
import json
import shutil

import numpy as np
import pytest
import requests

from net import free_port
from tests.helpers import ROOT, chat_body, make_adapter, png_data_url, run_driver, run_tool, short_run_args


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    make_adapter(tiny_model_dir, root / "alpha", seed=1, scale=30.0)
    make_adapter(tiny_model_dir, root / "beta", seed=2, scale=30.0)
    make_adapter(tiny_model_dir, root / "toolarge", seed=3, rank=32)
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
                   "max_lora_rank": "16", "cache_dir": str(cache), "max_body_bytes": str(2_000_000)}),
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


def body_with(**kw):
    return {**chat_body("BASE", image=False), **kw}


def image_body(url):
    return {"model": "BASE", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": url}]}]}


def user(content):
    return {"model": "BASE", "messages": [{"role": "user", "content": content}]}


JSON = {"content-type": "application/json"}
# (name, requests.post keyword arguments, status, words in the message). BASE becomes the base id.
HOSTILE = [
    # malformed JSON
    ("not json", {"data": b"{nope", "headers": JSON}, 400, "not valid JSON"),
    ("empty body", {"data": b"", "headers": JSON}, 400, "not valid JSON"),
    ("truncated json", {"data": b'{"model": "BASE"', "headers": JSON}, 400, "not valid JSON"),
    ("deep nesting", {"data": b"[" * 100_000, "headers": JSON}, 400, "not valid JSON"),
    ("array body", {"data": b"[1, 2]", "headers": JSON}, 400, "JSON object"),
    ("string body", {"data": b'"hello"', "headers": JSON}, 400, "JSON object"),
    ("null body", {"data": b"null", "headers": JSON}, 400, "JSON object"),
    ("invalid utf-8", {"data": b'{"model": "\xff\xfe"}', "headers": JSON}, 400, "not valid JSON"),
    ("NaN temperature", {"data": b'{"model": "BASE", "messages": [{"role": "user", "content": "hi"}], '
                                 b'"temperature": NaN}', "headers": JSON}, 400, "temperature"),
    # content types
    ("text/plain", {"data": json.dumps(chat_body("BASE", image=False)).encode(), "headers": {"content-type": "text/plain"}},
     415, "application/json"),
    ("no content type", {"data": json.dumps(chat_body("BASE", image=False)).encode()}, 415, "application/json"),
    ("form encoded", {"data": {"model": "BASE"}}, 415, "application/json"),
    # wrong types and shapes
    ("model int", {"json": {**chat_body("BASE", image=False), "model": 5}}, 400, "'model'"),
    ("model empty", {"json": {**chat_body("BASE", image=False), "model": ""}}, 400, "'model'"),
    ("model list", {"json": {**chat_body("BASE", image=False), "model": ["BASE"]}}, 400, "'model'"),
    ("no model", {"json": {"messages": [{"role": "user", "content": "hi"}]}}, 400, "'model'"),
    ("no messages", {"json": {"model": "BASE"}}, 400, "'messages'"),
    ("messages string", {"json": {"model": "BASE", "messages": "hi"}}, 400, "'messages'"),
    ("messages empty", {"json": {"model": "BASE", "messages": []}}, 400, "'messages'"),
    ("message string", {"json": {"model": "BASE", "messages": ["hi"]}}, 400, "role"),
    ("no role", {"json": {"model": "BASE", "messages": [{"content": "hi"}]}}, 400, "role"),
    ("bad role", {"json": {"model": "BASE", "messages": [{"role": "wizard", "content": "hi"}]}}, 400, "role"),
    ("content int", {"json": user(5)}, 400, "content"),
    ("content dict", {"json": user({"type": "text", "text": "hi"})}, 400, "content"),
    ("part string", {"json": user(["hi"])}, 400, "text or image_url part"),
    ("part audio", {"json": user([{"type": "input_audio", "input_audio": {}}])}, 400, "text or image_url part"),
    ("text int", {"json": user([{"type": "text", "text": 5}])}, 400, "text or image_url part"),
    ("image_url int", {"json": image_body(5)}, 400, "text or image_url part"),
    ("image_url empty", {"json": image_body({})}, 400, "needs a 'url'"),
    ("image url int", {"json": image_body({"url": 5})}, 400, "needs a 'url'"),
    ("lone surrogate", {"data": b'{"model": "BASE", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
                        "headers": JSON}, 400, "lone surrogate"),
    ("too many messages", {"json": {"model": "BASE", "messages": [{"role": "user", "content": "hi"}] * 257}}, 400,
     "at most 256 messages"),
    # sampling values
    ("temperature string", {"json": body_with(temperature="hot")}, 400, "temperature"),
    ("temperature bool", {"json": body_with(temperature=True)}, 400, "temperature"),
    ("temperature negative", {"json": body_with(temperature=-1)}, 400, "temperature"),
    ("temperature 3", {"json": body_with(temperature=3)}, 400, "temperature"),
    ("temperature 1e-300", {"json": body_with(temperature=1e-300)}, 400, "temperature"),
    ("top_p 0", {"json": body_with(top_p=0)}, 400, "top_p"),
    ("top_p 1.5", {"json": body_with(top_p=1.5)}, 400, "top_p"),
    ("max_tokens 0", {"json": body_with(max_tokens=0)}, 400, "max_tokens"),
    ("max_tokens huge", {"json": body_with(max_tokens=10 ** 6)}, 400, "max_tokens"),
    ("max_tokens float", {"json": body_with(max_tokens=2.5)}, 400, "max_tokens"),
    ("max_tokens string", {"json": body_with(max_tokens="8")}, 400, "max_tokens"),
    ("n 0", {"json": body_with(n=0)}, 400, "'n'"),
    ("n 99", {"json": body_with(n=99)}, 400, "'n'"),
    ("stop int", {"json": body_with(stop=5)}, 400, "'stop'"),
    ("stop five", {"json": body_with(stop=["a", "b", "c", "d", "e"])}, 400, "'stop'"),
    ("stop empty string", {"json": body_with(stop=[""])}, 400, "'stop'"),
    ("seed string", {"json": body_with(seed="7")}, 400, "'seed'"),
    ("seed negative", {"json": body_with(seed=-1)}, 400, "'seed'"),
    ("seed 2**64", {"json": body_with(seed=2 ** 64)}, 400, "'seed'"),
    ("unknown field", {"json": body_with(temprature=0.5)}, 400, "temprature"),
    ("unsupported feature", {"json": body_with(logit_bias={"5": 100})}, 400, "logit_bias"),
    # streaming
    ("stream yes", {"json": body_with(stream="yes")}, 400, "'stream'"),
    ("stream options", {"json": body_with(stream=True, stream_options={"bogus": 1})}, 400, "stream_options"),
    ("stream bad temperature", {"json": body_with(stream=True, temperature=9)}, 400, "temperature"),
    # images
    ("non-image data url", {"json": image_body({"url": "data:text/plain;base64,aGVsbG8="})}, 400, "base64 image"),
    ("broken image", {"json": image_body({"url": "data:image/png;base64,aGVsbG8="})}, 400, "readable image"),
    ("bad base64", {"json": image_body({"url": "data:image/png;base64,@@@@"})}, 400, "not valid base64"),
    ("remote url", {"json": image_body({"url": "http://169.254.169.254/x.png"})}, 400, "data URL"),
    ("file url", {"json": image_body({"url": "file:///etc/passwd"})}, 400, "data URL"),
    ("oversized image", {"json": image_body({"url": png_data_url(side=1100, noise=False)})}, 413, "pixels"),
    ("too many images", {"json": user([{"type": "image_url", "image_url": {"url": png_data_url(side=16)}}] * 17)},
     400, "at most 16 images"),
    # huge bodies
    ("oversized body", {"data": b"x" * 2_100_000, "headers": JSON}, 413, "bytes"),
    # model ids
    ("unknown model", {"json": chat_body("gpt-5", image=False)}, 404, "/v1/models"),
    ("unknown adapter", {"json": chat_body("BASE:ghost", image=False)}, 404, "not found"),
    ("path traversal", {"json": chat_body("BASE:../../etc", image=False)}, 400, "invalid"),
    ("absolute path", {"json": chat_body("BASE:/etc/passwd", image=False)}, 400, "invalid model id"),
    ("trailing newline", {"json": chat_body("BASE:alpha\n", image=False)}, 400, "invalid model id"),
    ("non-ascii model", {"json": chat_body("café", image=False)}, 400, "invalid model id"),
    ("non-ascii adapter", {"json": chat_body("BASE:café", image=False)}, 400, "invalid model id"),
    ("long model id", {"json": chat_body("m" * 300, image=False)}, 400, "invalid model id"),
    ("dot adapter", {"json": chat_body("BASE:..", image=False)}, 400, "invalid adapter name"),
    ("rank too large", {"json": chat_body("BASE:toolarge", image=False)}, 400, "max_lora_rank"),
]


def send_hostile(server, base, kwargs):
    if "json" in kwargs:
        kwargs = {"json": json.loads(json.dumps(kwargs["json"]).replace("BASE", base))}
    elif isinstance(kwargs.get("data"), bytes):
        kwargs = {**kwargs, "data": kwargs["data"].replace(b"BASE", base.encode())}
    return requests.post(f"{server}/v1/chat/completions", timeout=120, **kwargs)


def test_hostile_requests_get_4xx_in_openai_shape_and_never_fail_good_ones(server, tiny_model_dir, adapters):
    """Every hostile request gets its status and OpenAI's error shape, none reveals a server path,
    and good requests sent at the same time, batched with them, all succeed with the right answer."""
    from concurrent.futures import ThreadPoolExecutor
    assert len(HOSTILE) >= 60
    base = tiny_model_dir.rstrip("/").split("/")[-1]
    want = post(server, chat_body(base)).json()["choices"][0]["message"]["content"]
    jobs = [("hostile", case) for case in HOSTILE] + [("good", None)] * 24
    jobs = [jobs[i] for i in np.random.default_rng(0).permutation(len(jobs))]

    def go(job):
        kind, case = job
        return kind, case, (post(server, chat_body(base)) if kind == "good" else send_hostile(server, base, case[1]))
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(go, jobs))
    for kind, case, r in results:
        if kind == "good":
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == want, r.text
            continue
        name, _, status, words = case
        assert r.status_code == status, (name, r.status_code, r.text[:300])
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == status, (name, err)
        assert isinstance(err["message"], str) and words.replace("BASE", base) in err["message"], (name, err)
        assert str(adapters) not in r.text and "/tmp" not in r.text, (name, r.text)  # no server paths
    assert post(server, chat_body(base)).status_code == 200  # still up


def test_streaming_with_the_openai_client_gives_the_same_answer(server, tiny_model_dir):
    from openai import OpenAI
    base = tiny_model_dir.rstrip("/").split("/")[-1]
    client = OpenAI(base_url=f"{server}/v1", api_key="unused")
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                             {"type": "image_url", "image_url": {"url": png_data_url(1)}}]}]
    whole = client.chat.completions.create(model=f"{base}:alpha", max_tokens=5, temperature=0, messages=messages)
    chunks = list(client.chat.completions.create(model=f"{base}:alpha", max_tokens=5, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}, messages=messages))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


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


@pytest.mark.slow
def test_a_published_adapter_plays_the_mazes_as_eval_only_does(server, s3_server, tmp_path):
    """From training to serving: a short CPU run, `tools/publish.py` to the S3 server, the serve app
    serving it as <base>:<name>; a client's greedy moves on trail mazes equal `driver.py --eval-only` of
    that adapter, and the base's equal the eval harness's. The shipped base plays (a random tiny model's
    garbage text does not survive a text round trip), and the client draws each row's own pictures."""
    from ray import serve

    from actors.local import evaluate_locally
    from rl.inputs import load_datasets
    from serve_app import app
    from serving.maze_client import openai_chat, play_as_configured
    from settings import load_config
    run, s3 = tmp_path / "run", ["s3.endpoint_url=" + s3_server.url]
    args = short_run_args(run) + ["environment.env_class=maze_2d/easy_trail"]
    trained = run_driver(args)
    assert trained.returncode == 0, trained.stderr[-3000:]
    s3_server.client().create_bucket(Bucket="published")
    published = run_tool("publish", ["stage1", "--to", "s3://published/maze", *args, *s3])
    assert published.returncode == 0, published.stderr[-3000:]
    provenance = json.loads(s3_server.client().get_object(Bucket="published", Key="maze/stage1/provenance.json")["Body"].read())
    selection = json.loads((run / "exports" / "best" / "selection.json").read_text())
    assert provenance["step"] == selection["step"] and provenance["chosen_by"] == "validation"
    assert provenance["base_model"] == "assets/maze-vl-base" and len(provenance["config_sha256"]) == 64
    again = run_tool("publish", ["stage1", "--to", "s3://published/maze", *args, *s3])
    assert again.returncode == 2 and "exists already" in again.stderr and "--force" in again.stderr

    evaluated = run_driver(["--eval-only", "--adapter", str(run / "exports" / "best" / "policy"), *args[1:],
                            f"trainer.run_dir={tmp_path / 'eval'}"])
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    eval_only = [json.loads(line) for line in (tmp_path / "eval" / "eval_only.jsonl").read_text().splitlines()]
    serve.run(app({"base_model": str(ROOT / "assets" / "maze-vl-base"), "cache_dir": str(tmp_path / "cache"),
                   "dynamic_lora_loading_path": "s3://published/maze", "s3_endpoint_url": s3_server.url}),
              name="maze", route_prefix="/maze", blocking=False)
    cfg = load_config(None, args)
    _, rows = load_datasets(cfg)
    chat = openai_chat(f"{server}/maze/v1")
    harness = evaluate_locally(cfg, rows)
    assert max(m["turns"] for m in harness.per_row) > 2  # moves enough to leave a trail behind
    played = {model: [play_as_configured(chat, model, row, cfg) for row in rows]
              for model in ("maze-vl-base", "maze-vl-base:stage1")}
    serve.delete("maze")
    assert [p["answers"] for p in played["maze-vl-base"]] == [m["answers"] for m in harness.per_row]
    assert [p["answers"] for p in played["maze-vl-base:stage1"]] == [m["answers"] for m in eval_only]
    assert [p["solved"] for p in played["maze-vl-base:stage1"]] == [m["solved"] for m in eval_only]


def test_a_vllm_too_old_for_ray_serve_llm_gets_a_message_naming_both_versions(monkeypatch):
    """Ray's own message for it blames CUDA; the GPU machine's vLLM 0.26 met it (2026-12-04)."""
    import sys

    import serve_app
    from serving import ray_llm
    monkeypatch.setitem(sys.modules, "ray.serve.llm", None)  # the import fails, as Ray's serve code does there
    monkeypatch.setattr(ray_llm, "installed_vllm", lambda: "vllm 0.26.0")
    monkeypatch.setattr(ray_llm, "check_fastapi", lambda: None)
    with pytest.raises(ImportError) as e:
        serve_app.app({"backend": "vllm", "dynamic_lora_loading_path": "s3://adapters/"})
    message = str(e.value)
    assert "vllm 0.26.0" in message and ray_llm.ray_llm_vllm_pin() in message and "backend=hf" in message
    assert ray_llm.ray_llm_vllm_pin().startswith("vllm") and "==" in ray_llm.ray_llm_vllm_pin()


def test_ray_serve_llm_is_refused_under_a_fastapi_it_answers_400_with(monkeypatch):
    """From FastAPI 0.137 ray.serve.llm's ingress answers every request 400 (Ray 2.58 on an H200, Ray 2.60
    here): an app that could only fail is refused at start, naming the FastAPI and the fix."""
    from importlib import metadata

    import serve_app
    from serving import ray_llm
    real = metadata.version
    for version, refused in (("0.165.0", True), ("0.137.0", True), ("0.136.3", False)):
        monkeypatch.setattr(ray_llm.metadata, "version", lambda name, v=version: v if name == "fastapi" else real(name))
        if refused:
            with pytest.raises(ImportError, match=f"FastAPI {version}.*fastapi<0.137"):
                serve_app.app({"backend": "vllm", "dynamic_lora_loading_path": "s3://adapters/"})
        else:
            ray_llm.check_fastapi()  # passes: what comes next is ray.serve.llm's own import

