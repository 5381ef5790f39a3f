"""The trainer's LoRA update as one addmm: PEFT's values and gradients, on the GPU only, plain LoRA only."""
import pytest
import torch

from vlm.lora_addmm import addmm_update, fuse_lora_updates, plain_lora


def lora_model(dropout: float = 0.0, seed: int = 0):
    """Two linear layers under PEFT LoRA, the B matrices random (PEFT starts them at zero)."""
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(seed)
    two = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.Linear(24, 16, bias=False))
    model = get_peft_model(two, LoraConfig(r=4, lora_alpha=12, lora_dropout=dropout, target_modules=["0", "1"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return model


def lora_layers(model):
    from peft.tuners.lora import Linear
    return [m for m in model.modules() if isinstance(m, Linear)]


def test_the_addmm_update_gives_peft_values_and_gradients():
    model = lora_model()
    layer = lora_layers(model)[0]
    x = torch.randn(3, 5, 16, requires_grad=True)
    expected = layer(x)
    expected.square().sum().backward()
    want = [t.grad.clone() for t in (x, layer.lora_A["default"].weight, layer.lora_B["default"].weight)]
    for t in (x, layer.lora_A["default"].weight, layer.lora_B["default"].weight):
        t.grad = None
    got = addmm_update(layer, plain_lora(layer), x)
    got.square().sum().backward()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(expected, layer.base_layer(x))  # the update is there to be added
    for g, w in zip([x.grad, layer.lora_A["default"].weight.grad, layer.lora_B["default"].weight.grad], want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_only_plain_lora_takes_the_fused_path():
    model = lora_model()
    layer = lora_layers(model)[0]
    assert plain_lora(layer) == "default"
    with model.disable_adapter():  # the reference pass: the base alone
        assert plain_lora(layer) is None
    assert plain_lora(lora_layers(lora_model(dropout=0.1))[0]) is None  # dropout draws per element


def test_every_lora_layer_is_patched_once_and_the_cpu_keeps_peft_bitwise(monkeypatch):
    model = lora_model()
    x = torch.randn(2, 7, 16)
    before = model(x)
    assert fuse_lora_updates(model) == 2
    assert fuse_lora_updates(model) == 0
    calls = []
    addmm = torch.addmm
    monkeypatch.setattr(torch, "addmm", lambda *a, **k: (calls.append(1), addmm(*a, **k))[1])
    assert torch.equal(model(x), before) and calls == []


def test_the_trainer_gets_the_patch_with_its_speedups(tiny_model_dir):
    from actors.policy_shard import FSDPPolicyShard
    flags = {}
    for speedups in (True, False):
        shard = FSDPPolicyShard(tiny_model_dir, lora={"rank": 4, "alpha": 8}, speedups=speedups)
        shard.setup("127.0.0.1", 29561 + speedups)
        flags[speedups] = [getattr(m, "_patched__addmm_forward", False) for m in lora_layers(shard.model)]
        shard.shutdown()
    assert flags[True] and all(flags[True]) and not any(flags[False])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_the_gpu_under_autocast_the_addmm_path_runs_and_agrees(monkeypatch):
    model = lora_model().cuda()
    x = torch.randn(4, 33, 16, device="cuda").to(torch.bfloat16)
    for layer in lora_layers(model):
        layer.cast_input_dtype_enabled = False  # as vlm/sharding.py sets it for bf16 compute
    with torch.autocast("cuda", dtype=torch.bfloat16):
        expected = model(x)
        assert fuse_lora_updates(model) == 2
        calls = []
        addmm = torch.addmm
        monkeypatch.setattr(torch, "addmm", lambda *a, **k: (calls.append(1), addmm(*a, **k))[1])
        got = model(x)
    assert len(calls) == 2 and got.dtype == expected.dtype
    torch.testing.assert_close(got.float(), expected.float(), atol=3e-2, rtol=2e-2)


def test_the_hf_engine_gets_the_patch_with_its_speedups(tiny_model_dir, tmp_path):
    """The hf engine's LoRA layers take the trainer's addmm path (on a GPU), so both compute an
    adapter's update alike; without speedups they keep PEFT's forward."""
    from actors.vllm_engine import VLLMEngine
    from storage.adapters import AdapterRef
    from tests.helpers import make_adapter
    adapter = make_adapter(tiny_model_dir, tmp_path / "adapter", seed=1)
    flags = {}
    for speedups in (True, False):
        engine = VLLMEngine(tiny_model_dir, backend="hf", speedups=speedups)
        engine.load_adapter(AdapterRef(adapter, 1))
        flags[speedups] = [getattr(m, "_patched__addmm_forward", False) for m in lora_layers(engine.backend.model)]
    assert flags[True] and all(flags[True]) and not any(flags[False])
