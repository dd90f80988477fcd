"""An unmodified transformers + bitsandbytes 4-bit model runs through fastnf4 kernels once patched (counted),
with the same quantized weights and logits within GEMM rounding (GPU, transformers, bitsandbytes)."""
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
transformers = pytest.importorskip("transformers")
pytest.importorskip("bitsandbytes")

import fastnf4  # noqa: E402
from fastnf4.integrations import bitsandbytes as integ  # noqa: E402


def test_transformers_bnb_model_runs_on_fastnf4(tiny_llama_checkpoint, bnb_load):
    ids = torch.randint(0, 1000, (2, 24), device="cuda")

    fastnf4.unpatch_bitsandbytes()
    plain = bnb_load(tiny_llama_checkpoint)
    with torch.no_grad():
        logits0 = plain(ids).logits.float()
    w0 = plain.model.layers[0].mlp.up_proj.weight.data.clone()

    fastnf4.patch_bitsandbytes(("cuda",))
    integ.CALLS.clear()
    try:
        model = bnb_load(tiny_llama_checkpoint)  # quantized on load through fastnf4
        with torch.no_grad():
            logits1 = model(ids).logits.float()
        calls = dict(integ.CALLS)
    finally:
        fastnf4.unpatch_bitsandbytes()
    assert calls.get("quantize_4bit", 0) >= 14 and calls.get("gemm_4bit", 0) >= 14, calls
    assert torch.equal(model.model.layers[0].mlp.up_proj.weight.data, w0)  # bit-identical quantization
    rel = ((logits1 - logits0).norm() / logits0.norm()).item()
    assert rel < 2e-2, rel
    assert (logits1.argmax(-1) == logits0.argmax(-1)).float().mean() > 0.95
