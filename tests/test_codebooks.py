"""Code tables and decision thresholds: checked against their definitions and against bitsandbytes."""
from fractions import Fraction

import numpy as np
import pytest
import torch

from fastnf4 import codebooks


def test_nf4_table_is_sorted_and_symmetric_range():
    c = codebooks.code_4bit("nf4")
    assert c.dtype == torch.float32 and c.numel() == 16
    assert torch.all(c[1:] > c[:-1])
    assert c[0] == -1 and c[7] == 0 and c[15] == 1


def test_fp4_table_is_sign_magnitude():
    c = codebooks.code_4bit("fp4")
    assert torch.equal(c[8:].abs(), c[:8].abs())
    assert torch.all(c[9:] < 0) and torch.all(c[1:8] > 0)
    assert c.abs().max() == 1


@pytest.mark.parametrize("quant_type", codebooks.QUANT_TYPES)
def test_kernel_code_matches_table_up_to_sign_of_zero(quant_type):
    k = codebooks.kernel_code(quant_type, torch.device("cpu"))
    assert torch.equal(k, codebooks.code_4bit(quant_type))  # == treats -0.0 and +0.0 as equal
    if quant_type == "fp4":
        assert torch.signbit(k[8]) and not torch.signbit(codebooks.code_4bit("fp4")[8])


def _nearest_f32(x: Fraction) -> float:
    a = np.float32(float(x))
    cands = [np.nextafter(a, np.float32(-2)), a, np.nextafter(a, np.float32(2))]
    return float(min(cands, key=lambda c: abs(Fraction(float(c)) - x)))


def test_nf4_thresholds_are_printed_midpoints_rounded_once_to_float32():
    # bitsandbytes' thresholds are float literals: Python's repr of the double midpoint of two neighbouring
    # codes, which the CUDA compiler rounds straight from decimal to float32. For 4 of the 15 that differs
    # from rounding the double midpoint itself.
    c = codebooks.code_4bit("nf4").double().tolist()
    differs_from_double_rounding = 0
    for i, t in enumerate(codebooks.NF4_THRESHOLDS):
        mid = (c[i] + c[i + 1]) / 2
        assert c[i] < t < c[i + 1]
        assert t == _nearest_f32(Fraction(repr(mid))), i
        differs_from_double_rounding += t != float(np.float32(mid))
    assert differs_from_double_rounding == 4


def test_fp4_thresholds_separate_the_magnitudes():
    mags = sorted(set(codebooks.code_4bit("fp4").abs().tolist()))
    for i, t in enumerate(codebooks.FP4_THRESHOLDS):
        assert mags[i] < t < mags[i + 1]


def test_dynamic_map_shape_and_symmetry():
    d = codebooks.dynamic_map()
    assert d.numel() == 256 and torch.all(d[1:] >= d[:-1])
    assert d[127] == 0 and d[255] == 1
    assert torch.equal(d[:127], -d[128:255].flip(0))


def test_tables_equal_bitsandbytes():
    F = pytest.importorskip("bitsandbytes.functional")
    from conftest import bits

    assert torch.equal(bits(codebooks.dynamic_map()), bits(F.create_dynamic_map()))
    for qt in codebooks.QUANT_TYPES:
        assert torch.equal(bits(codebooks.code_4bit(qt)), bits(F.get_4bit_type(qt, device="cpu")))


_INFERENCE_SCRIPT = r"""
import sys, torch, fastnf4
torch.manual_seed(0)
w = torch.randn(64, 128, dtype=torch.bfloat16)
x = torch.randn(3, 128, dtype=torch.bfloat16)
if sys.argv[1] == "quantize":
    ref = fastnf4.quantize(w)
    with torch.inference_mode():
        q = fastnf4.quantize(w)
    assert torch.equal(q.packed, ref.packed) and torch.equal(q.absmax, ref.absmax)
else:
    q = fastnf4.quantize(w)
    with torch.inference_mode():
        y0 = fastnf4.linear(x, q)
    xg = x.clone().requires_grad_()
    y = fastnf4.linear(xg, q)
    y.float().sum().backward()
    assert torch.equal(y.detach(), y0) and xg.grad is not None
print("ok")
"""


@pytest.mark.parametrize("interpret", ["", "1"])
@pytest.mark.parametrize("case", ["quantize", "train"])
def test_tables_first_made_under_inference_mode(case, interpret, tmp_path):
    """In a fresh process (empty table caches): ``quantize`` under ``torch.inference_mode()`` gives the same weight as
    outside it, and a first ``linear`` under inference mode (an evaluation) does not leave inference tensors in the
    caches that a later autograd-recorded ``linear`` (a training step) would fail on ("Inference tensors cannot be
    saved for backward"). With the CPU reference ops and with the Triton kernels in the interpreter."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": interpret}
    res = subprocess.run([sys.executable, "-c", _INFERENCE_SCRIPT, case], env=env, capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-2000:]
