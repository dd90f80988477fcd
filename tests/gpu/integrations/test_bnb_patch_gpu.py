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


def test_inference_mode_model_runs_on_fastnf4(tiny_llama_checkpoint, bnb_load):
    """Under torch.inference_mode() (as vLLM and TGI run models) the patch sits at the CUDA key (bitsandbytes' CUDA
    kernels captured): the 4-bit calls of prefill (M = 48) and of a decode step (M = 2) run on fastnf4, with logits
    within GEMM rounding of unpatched bitsandbytes under the same mode; an uncovered call (float16 absmax) reaches
    bitsandbytes' own kernel with its bits."""
    ids = torch.randint(0, 1000, (2, 24), device="cuda")
    fastnf4.unpatch_bitsandbytes()
    plain = bnb_load(tiny_llama_checkpoint)
    with torch.inference_mode():
        logits0 = plain(ids).logits.float()
        step0 = plain(ids[:, :1]).logits.float()
    fastnf4.patch_bitsandbytes(("cuda",))
    try:
        assert {name for (name, dev), key in integ.patch_mode().items() if key == "CUDA"} >= {
            "quantize_4bit", "dequantize_4bit", "dequantize_4bit.out", "gemm_4bit", "gemv_4bit"}
        integ.CALLS.clear()
        with torch.inference_mode():
            logits1 = plain(ids).logits.float()
            step1 = plain(ids[:, :1]).logits.float()
        calls = dict(integ.CALLS)
        import bitsandbytes.functional as F

        w = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
        p, qs = F.quantize_4bit(w, blocksize=64, quant_type="nf4")
        integ.CALLS.clear()
        with torch.inference_mode():
            got = torch.ops.bitsandbytes.dequantize_4bit(p, qs.absmax.half(), 64, "nf4", [64, 256], torch.bfloat16)
        assert integ.CALLS["dequantize_4bit"] == 0
    finally:
        fastnf4.unpatch_bitsandbytes()
    with torch.inference_mode():
        want = torch.ops.bitsandbytes.dequantize_4bit(p, qs.absmax.half(), 64, "nf4", [64, 256], torch.bfloat16)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert calls.get("gemm_4bit", 0) >= 28, calls  # 14 linears x (prefill + step)
    for a, b in ((logits1, logits0), (step1, step0)):
        rel = ((a - b).norm() / b.norm()).item()
        assert rel < 2e-2, rel


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("nested", [False, True])
def test_decode_sizes_take_the_decode_kernel(m, nested):
    """gemm_4bit at M < 4 (bitsandbytes 0.50's decode path) and gemv_4bit (0.48/0.49's) go to fastnf4's CUDA
    decode kernel where it is built, with results within GEMM rounding of bitsandbytes' own."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    from fastnf4.ops.matmul import gemv_mma

    torch.manual_seed(m)
    n, k = 3000, 4096
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
    p, qs = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=nested)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    if not gemv_mma.supports(x, p.view(-1), 64, n, k, nested):
        pytest.skip("CUDA decode kernel not built here")
    ref = x.double() @ F.dequantize_4bit(p, qs).double().T
    fastnf4.unpatch_bitsandbytes()
    y0 = bnb.matmul_4bit(x, p.t(), quant_state=qs)
    fastnf4.patch_bitsandbytes(("cuda",))
    integ.CALLS.clear()
    try:
        y1 = bnb.matmul_4bit(x, p.t(), quant_state=qs)
        absmax = qs.absmax if not nested else (
            F.dequantize_blockwise(qs.absmax, qs.state2) + qs.offset)
        y2 = torch.ops.bitsandbytes.gemv_4bit(x, p, [n, k], absmax.float().contiguous(), qs.code, 64)
        calls = dict(integ.CALLS)
    finally:
        fastnf4.unpatch_bitsandbytes()
    assert calls.get("gemm_4bit") == 1 and calls.get("gemv_4bit") == 1, calls

    def rel(y):
        return ((y.double() - ref).norm() / ref.norm()).item()

    assert rel(y1) <= 2 * rel(y0) + 1e-6 and rel(y2) <= 2 * rel(y0) + 1e-6, (rel(y0), rel(y1), rel(y2))


@pytest.mark.parametrize("nested", [False, True])
def test_prepared_launches_match_and_follow_the_tensors(nested):
    """Patched calls reuse a launch prepared for the exact addresses and shapes of the call: outputs are
    bitwise those of the full path (fastnf4's op on the same tensors), also after the weight's storage is
    replaced in place or a bias appears."""
    import bitsandbytes.functional as F

    from fastnf4.api import linear_args
    from fastnf4.ops.matmul import gemv_mma

    torch.manual_seed(7)
    n, k = 4096, 2048
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    if not gemv_mma.supports(x, torch.zeros(16, dtype=torch.uint8, device="cuda"), 64, n, k, nested):
        pytest.skip("CUDA decode kernel not built here")

    def quant():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
        return F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=nested)

    def full(x, p, qs, bias=None):  # the full path on the same tensors
        return torch.ops.fastnf4.linear(x, *linear_args(fastnf4.NF4Weight.from_bnb(p, qs), bias))

    import bitsandbytes as bnb

    p, qs = quant()
    fastnf4.patch_bitsandbytes(("cuda",))
    integ.CALLS.clear()
    try:
        for m in (1, 2, 1, 160, 160, 33):  # decode sizes, then prefill (the prepared dequantize + cuBLAS)
            xm = torch.randn(1, m, k, device="cuda", dtype=torch.bfloat16)
            assert torch.equal(bnb.matmul_4bit(xm, p.t(), quant_state=qs), full(xm, p, qs))
        p2, qs2 = quant()  # same shapes, new values written into the same storage
        p.copy_(p2)
        qs.absmax.copy_(qs2.absmax)
        if nested:
            qs.state2.absmax.copy_(qs2.state2.absmax)
            qs.offset = qs2.offset
        assert torch.equal(bnb.matmul_4bit(x, p.t(), quant_state=qs), full(x, p, qs))
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        assert torch.equal(bnb.matmul_4bit(x, p.t(), quant_state=qs, bias=bias), full(x, p, qs, bias))
        calls = dict(integ.CALLS)
    finally:
        fastnf4.unpatch_bitsandbytes()
    assert calls.get("gemm_4bit") == 8, calls
    kinds = {type(p).__name__ for p in integ._PREPARED.values()}
    assert kinds == {"Prepared", "DequantMatmul"}, kinds


@pytest.mark.parametrize("m,k", [(1, 100), (1, 1000), (2, 4096), (3, 130)])
def test_gemv_calls_bitsandbytes_gets_wrong_are_taken(m, k):
    """bitsandbytes' own gemv_4bit kernel computes x's first row only and gets K % 32 != 0 wrong (relative error ~1,
    benchmarks/results/h200-probe-bnb-gemv.txt); the patch takes those calls (also the ``out=`` form) and gives the
    product within GEMM rounding."""
    import bitsandbytes.functional as F

    torch.manual_seed(k + m)
    n = 768
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
    p, qs = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    wd = F.dequantize_4bit(p, qs)
    ref = x.double() @ wd.double().T
    yardstick = ((torch.nn.functional.linear(x, wd).double() - ref).norm() / ref.norm()).item()
    fastnf4.patch_bitsandbytes(("cuda",))
    integ.CALLS.clear()
    try:
        y = F.gemv_4bit(x, p.t(), state=qs)
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        F.gemv_4bit(x, p.t(), state=qs, out=out)
        calls = dict(integ.CALLS)
    finally:
        fastnf4.unpatch_bitsandbytes()
    assert calls.get("gemv_4bit") == 2, calls
    for got in (y, out):
        assert got.shape == (m, n)
        assert ((got.double() - ref).norm() / ref.norm()).item() <= 2 * yardstick + 1e-6
