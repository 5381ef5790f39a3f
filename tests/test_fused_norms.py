"""RMSNorms run as one fused kernel on CUDA tensors and as transformers wrote them elsewhere."""
import pytest
import torch

from vlm.fused_norms import fuse_rms_norms


def norm_outputs(model, x):
    return [m(x[..., :m.weight.shape[0]]) for m in model.modules() if type(m).__name__.endswith("RMSNorm")]


def test_the_cpu_keeps_transformers_norms_bitwise(tiny_model_dir):
    from transformers import AutoModelForImageTextToText
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir).eval()
    x = torch.randn(3, 5, 64)
    expected = norm_outputs(model, x)
    # one text layer: its two layer norms, the query and key norms; and the final norm
    assert fuse_rms_norms(model) == 5
    assert fuse_rms_norms(model) == 0
    for got, want in zip(norm_outputs(model, x), expected, strict=True):
        assert torch.equal(got, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_norm_gives_transformers_values_and_gradients(dtype, monkeypatch):
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRMSNorm
    holder = torch.nn.Module()
    holder.norm = Qwen3VLTextRMSNorm(256, eps=1e-6).to("cuda", dtype)
    with torch.no_grad():
        holder.norm.weight.uniform_(0.5, 1.5)
    x = (3 * torch.randn(4, 33, 256, device="cuda")).to(dtype).requires_grad_()
    expected = holder.norm(x)
    expected.float().square().sum().backward()
    want_x, want_w = x.grad.clone(), holder.norm.weight.grad.clone()
    x.grad, holder.norm.weight.grad = None, None
    assert fuse_rms_norms(holder) == 1
    calls = []
    rms_norm = torch.nn.functional.rms_norm
    monkeypatch.setattr(torch.nn.functional, "rms_norm", lambda *a, **k: (calls.append(1), rms_norm(*a, **k))[1])
    got = holder.norm(x)
    assert calls == [1]  # the fused kernel, not transformers' eight
    got.float().square().sum().backward()
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(got, expected, **tol)
    torch.testing.assert_close(x.grad, want_x, **tol)
    torch.testing.assert_close(holder.norm.weight.grad.float(), want_w.float(), atol=tol["atol"] * 50, rtol=tol["rtol"])
