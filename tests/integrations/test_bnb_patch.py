"""patch_bitsandbytes: bitsandbytes' own API runs on fastnf4 kernels (counted), with the same results, and
calls fastnf4 does not cover fall through to bitsandbytes. On CPU the patch is applied to the CPU kernels
(the fastnf4 side then runs in Triton's interpreter); tests/gpu/integrations/test_bnb_patch_gpu.py does it on CUDA."""
import pytest
import torch

import fastnf4
from fastnf4 import _triton
from helpers import bits

bnb = pytest.importorskip("bitsandbytes")
F = pytest.importorskip("bitsandbytes.functional")
from fastnf4.integrations import bitsandbytes as integ  # noqa: E402

pytestmark = pytest.mark.skipif(not _triton.use_triton(torch.device("cpu")), reason="needs TRITON_INTERPRET=1")


@pytest.fixture
def patched():
    taken = fastnf4.patch_bitsandbytes(("cpu",))
    integ.CALLS.clear()
    yield taken
    fastnf4.unpatch_bitsandbytes()


def test_patch_covers_the_4bit_ops(patched):
    assert {"dequantize_4bit", "dequantize_4bit.out", "quantize_4bit"} <= set(patched)
    assert integ.is_patched()


@pytest.mark.parametrize("nested", [False, True])
def test_bnb_api_runs_on_fastnf4_with_identical_results(nested, rng):
    w = (torch.randn(96, 128, generator=rng) * 0.05).to(torch.bfloat16)
    x = torch.randn(6, 128, generator=rng).to(torch.bfloat16)
    p0, qs0 = F.quantize_4bit(w, blocksize=64, compress_statistics=nested, quant_type="nf4")
    d0 = F.dequantize_4bit(p0, qs0)
    y0 = bnb.matmul_4bit(x, p0.t(), quant_state=qs0)
    fastnf4.patch_bitsandbytes(("cpu",))
    integ.CALLS.clear()
    try:
        p1, qs1 = F.quantize_4bit(w, blocksize=64, compress_statistics=nested, quant_type="nf4")
        d1 = F.dequantize_4bit(p1, qs1)
        out = torch.empty_like(d1)
        F.dequantize_4bit(p1, qs1, out=out)
        y1 = bnb.matmul_4bit(x, p1.t(), quant_state=qs1)
        calls = dict(integ.CALLS)
    finally:
        fastnf4.unpatch_bitsandbytes()
    assert calls.get("quantize_4bit") == 1 and calls.get("dequantize_4bit") == 1
    assert calls.get("dequantize_4bit.out") == 1
    assert torch.equal(p1, p0) and torch.equal(bits(d1), bits(d0)) and torch.equal(bits(out), bits(d0))
    ref = x.double() @ d0.double().T
    err0 = ((y0.double() - ref).norm() / ref.norm()).item()
    err1 = ((y1.double() - ref).norm() / ref.norm()).item()
    assert err1 <= 2 * err0 + 1e-6
    if hasattr(torch.ops.bitsandbytes, "gemm_4bit"):
        assert calls.get("gemm_4bit") == 1


def test_uncovered_calls_fall_through_to_bitsandbytes(patched, rng):
    w = (torch.randn(32, 64, generator=rng) * 0.05).to(torch.bfloat16)
    p, qs = F.quantize_4bit(w, blocksize=64, quant_type="nf4")
    integ.CALLS.clear()
    x = torch.randn(1, 64, generator=rng).to(torch.bfloat16)  # M = 1: bitsandbytes keeps it
    y = bnb.matmul_4bit(x, p.t(), quant_state=qs)
    assert integ.CALLS["gemm_4bit"] == 0
    ref = x.double() @ F.dequantize_4bit(p, qs).double().T
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-2
    # statistics in a dtype fastnf4 does not take (float16 absmax) go to bitsandbytes' kernel as they are
    absmax16 = qs.absmax.half()
    integ.CALLS.clear()
    got = torch.ops.bitsandbytes.dequantize_4bit(p, absmax16, 64, "nf4", [32, 64], torch.bfloat16)
    assert integ.CALLS["dequantize_4bit"] == 0
    fastnf4.unpatch_bitsandbytes()
    want = torch.ops.bitsandbytes.dequantize_4bit(p, absmax16, 64, "nf4", [32, 64], torch.bfloat16)
    assert torch.equal(bits(got), bits(want))


def test_inference_mode_runs_on_fastnf4_at_the_backend_key(patched, rng):
    """Under torch.inference_mode() (vLLM, TGI) the Autograd keys are skipped; the ops whose bitsandbytes kernel was
    captured are patched at the CPU key, so the calls still run on fastnf4 (counted, same bits / within the GEMM
    error), and an uncovered call (M = 1 on CPU: no decode kernel here) reaches bitsandbytes' own kernel (captured).
    (bitsandbytes 0.48 / 0.49 have no gemm_4bit op: their matmul_4bit dequantizes, then multiplies.)"""
    from fastnf4.integrations.bitsandbytes import patch_mode

    has_gemm = hasattr(torch.ops.bitsandbytes, "gemm_4bit")
    at_cpu = {name for (name, dev), key in patch_mode().items() if key == "CPU"}
    assert at_cpu >= {"quantize_4bit", "dequantize_4bit", "gemv_4bit"} | ({"gemm_4bit"} if has_gemm else set())
    w = (torch.randn(96, 128, generator=rng) * 0.05).to(torch.bfloat16)
    x = torch.randn(6, 128, generator=rng).to(torch.bfloat16)
    x1 = x[:1].clone()
    fastnf4.unpatch_bitsandbytes()
    with torch.inference_mode():
        p0, qs0 = F.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
        d0 = F.dequantize_4bit(p0, qs0)
        y1_0 = bnb.matmul_4bit(x1, p0.t(), quant_state=qs0)
    fastnf4.patch_bitsandbytes(("cpu",))
    integ.CALLS.clear()
    with torch.inference_mode():
        p1, qs1 = F.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
        d1 = F.dequantize_4bit(p1, qs1)
        y = bnb.matmul_4bit(x, p1.t(), quant_state=qs1)
        counted = dict(integ.CALLS)
        originals = integ._state["originals"]
        reached = []
        for name in ("gemv_4bit", "gemm_4bit"):  # (count the calls that reach bitsandbytes' captured kernels)
            if (name, "cpu") in originals:
                fn = originals[(name, "cpu")]
                originals[(name, "cpu")] = lambda *a, fn=fn, name=name: reached.append(name) or fn(*a)
        y1 = bnb.matmul_4bit(x1, p1.t(), quant_state=qs1)  # M = 1: bitsandbytes' captured kernel
    assert counted.get("quantize_4bit") == 1
    if has_gemm:
        assert counted.get("dequantize_4bit") == 1 and counted.get("gemm_4bit") == 1
        # the M = 1 call was not taken (bitsandbytes' kernel ran; its own dequantize calls reach fastnf4's)
        assert integ.CALLS["gemm_4bit"] == 1 and integ.CALLS["gemv_4bit"] == 0 and len(reached) == 1
    else:  # (their CPU matmul_4bit at M = 1 may dequantize instead of calling gemv_4bit: no count asserted)
        assert counted.get("dequantize_4bit") == 2  # (F.dequantize_4bit and matmul_4bit's own)
        assert integ.CALLS["gemv_4bit"] == 0
    assert torch.equal(p1, p0)
    if has_gemm:  # bitsandbytes 0.50's CPU kernels round as its CUDA ones, which fastnf4 matches bit for bit
        assert torch.equal(bits(d1), bits(d0)) and torch.equal(bits(y1), bits(y1_0))
    else:  # (0.48 / 0.49's CPU dequantize rounds some values otherwise: within one bf16 step)
        assert ((d1.float() - d0.float()).abs() <= 2.0 ** -7 * d0.float().abs()).all()
        assert ((y1.float() - y1_0.float()).abs() <= 2.0 ** -6 * y1_0.float().abs().max()).all()
    ref = x.double() @ d0.double().T
    want = torch.nn.functional.linear(x, d0)
    assert ((y.double() - ref).norm() / ref.norm()).item() <= 2 * ((want.double() - ref).norm() / ref.norm()).item()


def test_autograd_key_patch_is_skipped_under_inference_mode(rng):
    """backend_key=False: the Autograd-key patch (the form before 48ee61e) runs under no_grad, not under
    inference_mode (bitsandbytes' kernel then runs)."""
    w = torch.randn(32, 64, generator=rng)
    p, qs = F.quantize_4bit(w, blocksize=64, quant_type="nf4")
    fastnf4.patch_bitsandbytes(("cpu",), backend_key=False)
    try:
        assert set(integ.patch_mode().values()) == {"AutogradCPU"}
        integ.CALLS.clear()
        with torch.inference_mode():
            F.dequantize_4bit(p, qs)
        assert integ.CALLS["dequantize_4bit"] == 0
        with torch.no_grad():
            F.dequantize_4bit(p, qs)
        assert integ.CALLS["dequantize_4bit"] == 1
    finally:
        fastnf4.unpatch_bitsandbytes()


def test_unpatch_restores_bitsandbytes(rng):
    fastnf4.patch_bitsandbytes(("cpu",))
    fastnf4.unpatch_bitsandbytes()
    integ.CALLS.clear()
    w = torch.randn(16, 64, generator=rng)
    p, qs = F.quantize_4bit(w, blocksize=64, quant_type="nf4")
    F.dequantize_4bit(p, qs)
    assert sum(integ.CALLS.values()) == 0 and not integ.is_patched()


def test_autopatch_is_on_unless_switched_off(monkeypatch):
    from fastnf4 import _bnb_entry

    fastnf4.unpatch_bitsandbytes()
    monkeypatch.setenv("FASTNF4_PATCH_BITSANDBYTES", "0")
    _bnb_entry.autopatch()
    assert not integ.is_patched()
    monkeypatch.delenv("FASTNF4_PATCH_BITSANDBYTES", raising=False)
    try:
        _bnb_entry.autopatch()
        assert integ.is_patched() and integ._state["devices"] == ("cuda",)
    finally:
        fastnf4.unpatch_bitsandbytes()
    assert not integ.is_patched()


def test_calls_the_patch_must_leave_to_bitsandbytes(patched, rng):
    """(Fixed in 1a6694f.) Double-quant statistics that are not contiguous, and K = 0, go to bitsandbytes' kernel
    (they raised in fastnf4's checks / divided by zero); the result is bitsandbytes' own."""
    p, st = F.quantize_4bit(torch.randn(64, 512, generator=rng), blocksize=64, compress_statistics=True,
                            quant_type="nf4")
    st.absmax = torch.stack([st.absmax, st.absmax], 1)[:, 0]  # the same codes, strided
    x = torch.randn(6, 512, generator=rng)
    integ.CALLS.clear()
    got = bnb.matmul_4bit(x, p.t(), quant_state=st)
    assert integ.CALLS["gemm_4bit"] == 0
    empty = (torch.randn(6, 0, generator=rng), torch.empty(0, 1, dtype=torch.uint8), [32, 0], torch.empty(0), 64, "nf4")
    got_empty = torch.ops.bitsandbytes.gemm_4bit(*empty)
    fastnf4.unpatch_bitsandbytes()
    assert torch.equal(bits(got), bits(bnb.matmul_4bit(x, p.t(), quant_state=st)))
    assert torch.equal(got_empty, torch.ops.bitsandbytes.gemm_4bit(*empty))
    with pytest.raises(ValueError, match="not \\['xpu'\\]"):
        fastnf4.patch_bitsandbytes(("cpu", "xpu"))


def test_a_fake_tensor_trace_leaves_no_fake_tables_behind():
    """(Fixed in 1a6694f.) The first use of a code table under a FakeTensorMode (a patched op reached with fake
    tensors) used to cache a fake table for good: every real call after it failed. In a fresh process."""
    import os
    import subprocess
    import sys

    code = """
import torch
import bitsandbytes.functional as F, fastnf4
from torch._subclasses.fake_tensor import FakeTensorMode
p, st = F.quantize_4bit(torch.randn(48, 64), blocksize=64, quant_type="nf4")
fastnf4.patch_bitsandbytes(("cpu",), backend_key=False)
try:
    with FakeTensorMode(allow_non_fake_inputs=True):
        torch.ops.bitsandbytes.dequantize_4bit(p, st.absmax, 64, "nf4", [48, 64], torch.float32)
except Exception:
    pass
fastnf4.unpatch_bitsandbytes()
fastnf4.patch_bitsandbytes(("cpu",))
d = F.dequantize_4bit(p, st)
fastnf4.unpatch_bitsandbytes()
assert torch.equal(d, F.dequantize_4bit(p, st))
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "TRITON_INTERPRET": "1"})
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


def test_one_device_type_may_be_given_as_a_string():
    try:
        assert fastnf4.patch_bitsandbytes("cpu") == fastnf4.patch_bitsandbytes(("cpu",))  # not its letters
        with pytest.raises(ValueError, match=r"not \['tpu'\]"):
            fastnf4.patch_bitsandbytes("tpu")
    finally:
        fastnf4.unpatch_bitsandbytes()


@pytest.mark.parametrize("offset_dtype", [torch.float16, torch.bfloat16])
def test_gemm_4bit_takes_a_non_float32_offset_as_bitsandbytes_does(offset_dtype, rng):
    """A double-quant weight whose offset is fp16 / bf16 (pre-quantized checkpoints): bitsandbytes' gemm_4bit casts the
    offset to float32 first, so the patched op gives what it gives for that float32 value (bitsandbytes' regression
    test test_gemm_4bit_non_float32_offset, which compares the two calls). Before: the fp16 / bf16 call went to
    bitsandbytes' kernel and the float32 one to fastnf4's, and on the GPU the two differed."""
    w = torch.randn(64, 64, generator=rng)
    x = torch.randn(4, 64, generator=rng)
    p, qs = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
    offset = qs.offset.to(offset_dtype)
    args = (x, p, [64, 64], qs.state2.absmax, 64, "nf4")
    fastnf4.patch_bitsandbytes(("cpu",))
    try:
        integ.CALLS.clear()
        got = torch.ops.bitsandbytes.gemm_4bit(*args, absmax_8bit=qs.absmax, absmax_code=qs.state2.code,
                                               absmax_offset=offset)
        assert integ.CALLS["gemm_4bit"] == 1  # fastnf4 took it
        ref = torch.ops.bitsandbytes.gemm_4bit(*args, absmax_8bit=qs.absmax, absmax_code=qs.state2.code,
                                               absmax_offset=offset.float())
    finally:
        fastnf4.unpatch_bitsandbytes()
    assert torch.equal(bits(got), bits(ref))
    # and that value is the one an independent decode gives: bitsandbytes' own dequantize with the float32 offset
    qs.offset = offset.float()
    dense = F.dequantize_4bit(p, qs).double()
    expect = x.double() @ dense.T
    assert (got.double() - expect).norm() / expect.norm() < 1e-5
