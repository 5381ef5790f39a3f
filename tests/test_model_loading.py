"""Model loading from a local folder, s3:// (a real local S3 server) and a Hugging Face id (a local
hub stand-in), and the chat prompt pieces against the processor's own template."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from vlm.load import load_model, resolve_model_path

ROOT = Path(__file__).resolve().parent.parent


def same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_local_folder_and_s3(tiny_model_dir, s3_server, tmp_path, capsys):
    from settings.schema import S3Config
    local, processor = load_model(tiny_model_dir)
    assert type(processor).__name__ == "ImageOnlyQwen3VLProcessor"
    client = s3_server.client()
    client.create_bucket(Bucket="models")
    for f in Path(tiny_model_dir).iterdir():
        client.upload_file(str(f), "models", f"sft/tiny/{f.name}")
    cfg = S3Config(endpoint_url=s3_server.url)
    folder = resolve_model_path("s3://models/sft/tiny", cfg, cache_dir=tmp_path)
    assert "=== Downloading SFT checkpoint ===" in capsys.readouterr().out
    from_s3, _ = load_model(folder)
    assert same_weights(local, from_s3)
    resolve_model_path("s3://models/sft/tiny", cfg, cache_dir=tmp_path)  # cached: no second download
    assert "Downloading" not in capsys.readouterr().out


def test_hugging_face_id_through_a_local_hub(tiny_model_dir, tmp_path):
    from tests.fake_hub import FakeHub
    hub = FakeHub("visgym/tiny-maze-sft", tiny_model_dir)
    try:
        code = ("import sys; sys.path.insert(0, %r)\n"
                "from vlm.load import resolve_model_path, load_model\n"
                "p = resolve_model_path('visgym/tiny-maze-sft', cache_dir=%r)\n"
                "m, proc = load_model(p); print('OK', p, type(proc).__name__)") % (str(ROOT), str(tmp_path))
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0"}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "=== Downloading SFT checkpoint ===" in out.stdout and "OK" in out.stdout
        assert any("/resolve/" in p for _, p in hub.requests)
    finally:
        hub.stop()


def test_the_head_downloads_only_the_processor_files(tiny_model_dir, s3_server, tmp_path):
    """The driver builds prompts from the processor: from S3 and from the hub it fetches no weights."""
    from settings.schema import S3Config
    from tests.fake_hub import FakeHub
    from vlm.processor import load_processor
    weights = {f.name for f in Path(tiny_model_dir).glob("*.safetensors")}
    assert weights
    client = s3_server.client()
    client.create_bucket(Bucket="heads")
    for f in Path(tiny_model_dir).iterdir():
        client.upload_file(str(f), "heads", f"sft/tiny/{f.name}")
    folder = resolve_model_path("s3://heads/sft/tiny", S3Config(endpoint_url=s3_server.url), cache_dir=tmp_path / "s3",
                                weights=False)
    assert not weights & {f.name for f in Path(folder).iterdir()}
    assert load_processor(folder).tokenizer.convert_tokens_to_ids("<|image_pad|>") is not None
    hub = FakeHub("visgym/tiny-maze-head", tiny_model_dir)
    try:
        code = ("import sys; sys.path.insert(0, %r)\n"
                "from vlm.load import resolve_model_path\n"
                "from vlm.processor import load_processor\n"
                "p = resolve_model_path('visgym/tiny-maze-head', cache_dir=%r, weights=False)\n"
                "load_processor(p); print('OK')") % (str(ROOT), str(tmp_path / "hub"))
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0"}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-2000:]
        fetched = {p.rsplit("/", 1)[-1] for _, p in hub.requests if "/resolve/" in p}
        assert fetched and not fetched & weights, fetched
    finally:
        hub.stop()


def test_unknown_model_path_is_a_clear_error(tmp_path):
    import pytest
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model_path(str(tmp_path / "nope" / "deeper" / "still"))
    with pytest.raises(FileNotFoundError, match="does not exist"):  # an existing first folder: local, not a hub id
        resolve_model_path("assets/no-such-model")
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model_path(str(tmp_path))


def test_prompt_pieces_equal_the_processors_own_template(tiny_model_dir):
    """Token-in-token-out pieces == tokenizing the chat rendered by the processor's template."""
    from envs.prompt import INSTRUCTION
    from vlm.chat import ChatPrompter
    from vlm.processor import load_processor
    proc = load_processor(tiny_model_dir)
    prompter = ChatPrompter(proc.tokenizer, 81, INSTRUCTION)
    answer = proc.tokenizer.encode("<action>up</action>", add_special_tokens=False)
    ids, pictures = prompter.prompt(["", "Moved up."], [answer], window=0, pictures=1)
    messages = [{"role": "system", "content": INSTRUCTION},
                {"role": "user", "content": [{"type": "text", "text": ""}]},
                {"role": "assistant", "content": "<action>up</action>"},
                {"role": "user", "content": [{"type": "text", "text": "Moved up."}, {"type": "image"}]}]
    text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    img = np.zeros((144, 144, 3), np.uint8)
    enc = proc(text=[text], images=[img], return_tensors="np")
    assert enc["input_ids"][0].tolist() == ids and pictures == [1]


def test_every_speed_up_patch_applies_and_a_renamed_class_fails_loudly(tiny_model_dir):
    """The patches of vlm/ find their modules under the installed transformers; a release that renamed
    what one replaces stops the load with the patch's name instead of running slower unnoticed."""
    import pytest
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    from vlm.load import PatchError
    model, _ = load_model(tiny_model_dir)
    for flag in ("_patched__one_call_forward", "_patched__unique_forward", "_patched__matmul_forward",
                 "_patched__fused_forward", "_patched__rope_index"):
        assert any(getattr(m, flag, False) for m in model.modules()), flag
    attention = modeling_qwen3_vl.Qwen3VLVisionAttention
    name, attention.__name__ = attention.__name__, "Qwen3VLVisionSelfAttn"  # as a release that renamed it
    try:
        with pytest.raises(PatchError, match="batch_picture_attention matched no module.*transformers"):
            load_model(tiny_model_dir)
    finally:
        attention.__name__ = name


def test_one_switch_turns_every_speed_up_off(tiny_model_dir):
    """trainer.policy.model.speedups=false: transformers' own code in every model load (no module
    patched) and the hf engine decoding with `generate`, not its own loop; the answers are the same."""
    from actors.vllm_engine import VLLMEngine, engine_settings
    from inference.requests import Sampling
    from settings import load_config
    from tests.helpers import requests_for
    from vlm.chat import ChatPrompter
    from vlm.processor import load_processor
    plain, _ = load_model(tiny_model_dir, speedups=False)
    assert not any(name.startswith("_patched_") for m in plain.modules() for name in vars(m))
    off = load_config(None, ["trainer.policy.model.speedups=false", f"trainer.policy.model.path={tiny_model_dir}"])
    on = load_config(None, [f"trainer.policy.model.path={tiny_model_dir}"])
    assert engine_settings(off)["decode_loop"] == "hf" and engine_settings(on)["decode_loop"] == "graphs"
    engines = {name: VLLMEngine(tiny_model_dir, device="cpu", **engine_settings(cfg)) for name, cfg in (("off", off), ("on", on))}
    patched = [any(n.startswith("_patched_") for m in e.backend.model.modules() for n in vars(m)) for e in engines.values()]
    assert patched == [False, True]
    prompter = ChatPrompter(load_processor(tiny_model_dir).tokenizer, 81, "")
    reqs = requests_for(prompter, [1, 2], ["", "Moved up."])
    greedy = Sampling(max_new_tokens=5, temperature=0.0)
    assert [r.token_ids for r in engines["off"].generate(reqs, greedy)] == \
        [r.token_ids for r in engines["on"].generate(reqs, greedy)]
