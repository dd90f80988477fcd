"""NF4Weight: bitsandbytes and transformers checkpoint layouts, round trips, the public API."""
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

import fastnf4
from fastnf4 import NF4Weight
from helpers import FLOATS, bits, poisoned, random_weight


@pytest.mark.parametrize("double_quant", [False, True])
def test_state_dict_keys_dtypes_and_json(double_quant, rng):
    q = fastnf4.quantize(random_weight(96 * 80, torch.bfloat16, rng).view(96, 80), double_quant=double_quant)
    sd = q.state_dict("model.layers.0.mlp.up_proj.")
    p = "model.layers.0.mlp.up_proj.weight"
    expected = {p: torch.uint8, f"{p}.absmax": torch.uint8 if double_quant else torch.float32,
                f"{p}.quant_map": torch.float32, f"{p}.quant_state.bitsandbytes__nf4": torch.uint8}
    if double_quant:
        expected.update({f"{p}.nested_absmax": torch.float32, f"{p}.nested_quant_map": torch.float32})
    assert {k: v.dtype for k, v in sd.items()} == expected
    assert sd[p].shape == (96 * 80 // 2, 1)
    fields = json.loads(bytes(sd[f"{p}.quant_state.bitsandbytes__nf4"].tolist()))
    assert fields["shape"] == [96, 80] and fields["dtype"] == "bfloat16" and fields["blocksize"] == 64
    assert fields["quant_type"] == "nf4" and ("nested_offset" in fields) == double_quant


@pytest.mark.parametrize("double_quant", [False, True])
@pytest.mark.parametrize("shape", [(33, 7), (4096,), (3, 5, 64)])
def test_safetensors_round_trip_is_lossless(shape, double_quant, tmp_path, rng):
    w = random_weight(int(torch.tensor(shape).prod()), torch.float16, rng).view(shape)
    q = fastnf4.quantize(w, blocksize=128, double_quant=double_quant)
    save_file(q.state_dict("lin."), str(tmp_path / "w.safetensors"))
    q2 = NF4Weight.from_state_dict(load_file(str(tmp_path / "w.safetensors")), "lin.")
    assert q2.shape == q.shape and q2.dtype == q.dtype and q2.blocksize == 128 and q2.nested == double_quant
    assert torch.equal(bits(fastnf4.dequantize(q2)), bits(fastnf4.dequantize(q)))
    for k, v in q.state_dict().items():
        assert torch.equal(v, q2.state_dict()[k]), k


def test_bitsandbytes_round_trip_and_identical_checkpoint_bytes(rng):
    F = pytest.importorskip("bitsandbytes.functional")
    w = random_weight(128 * 64, torch.bfloat16, rng).view(128, 64)
    packed, qs = F.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
    q = NF4Weight.from_bnb(packed, qs)
    ours = q.state_dict("x.")
    theirs = {f"x.weight.{k}": v for k, v in qs.as_dict(packed=True).items()}
    theirs["x.weight"] = packed
    assert ours.keys() == theirs.keys()
    for k in ours:
        assert ours[k].dtype == theirs[k].dtype and torch.equal(ours[k], theirs[k]), k
    packed2, qs2 = q.to_bnb()
    assert torch.equal(bits(F.dequantize_4bit(packed2, qs2)), bits(F.dequantize_4bit(packed, qs)))
    q3 = NF4Weight.from_state_dict(theirs, "x.")
    assert torch.equal(bits(fastnf4.dequantize(q3)), bits(F.dequantize_4bit(packed, qs)))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_dequantize_out_and_dtype(dtype, rng):
    q = fastnf4.quantize(random_weight(64 * 10, torch.bfloat16, rng).view(10, 64), double_quant=False)
    out = poisoned((640,), dtype)
    r = fastnf4.dequantize(q, out=out)
    assert r.shape == (10, 64) and r.data_ptr() == out.data_ptr() and not torch.isnan(out).any()
    assert torch.equal(bits(r), bits(fastnf4.dequantize(q, dtype=dtype)))


def test_empty_tensors():
    for shape in [(0,), (0, 64), (5, 0)]:
        q = fastnf4.quantize(torch.empty(shape, dtype=torch.bfloat16))
        assert q.packed.numel() == 0 and q.absmax.numel() == 0
        assert fastnf4.dequantize(q).shape == shape


def test_import_never_touches_a_gpu():
    code = ("import torch\n"
            "def boom(*a, **k): raise AssertionError('GPU touched')\n"
            "torch.cuda.init = boom; torch.cuda._lazy_init = boom; torch.cuda.is_available = boom\n"
            "import fastnf4, fastnf4.bench.registry, fastnf4.cli\n"
            "print(fastnf4.__version__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "TRITON_INTERPRET": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == fastnf4.__version__


@pytest.mark.parametrize("path", ["kernel", "reference"])
def test_dequantize_out_of_the_weights_shape(path, rng, monkeypatch):
    """``out`` may have any shape with the right number of elements (the README's weight-shaped buffer), on the
    Triton path and on the pure-PyTorch one (CPU without the interpreter, GPUs below sm_80)."""
    if path == "reference":
        monkeypatch.setattr(fastnf4._triton, "use_triton", lambda device: False)
    elif not fastnf4._triton.use_triton(torch.device("cpu")):
        pytest.skip("needs TRITON_INTERPRET=1")
    q = fastnf4.quantize(random_weight(64 * 10, torch.bfloat16, rng).view(10, 64))
    ref = fastnf4.dequantize(q)
    for shape in [(10, 64), (640,), (640, 1), (2, 5, 64)]:
        out = poisoned(shape, torch.bfloat16)
        r = fastnf4.dequantize(q, out=out)
        assert r.shape == (10, 64) and r.data_ptr() == out.data_ptr()
        assert torch.equal(bits(out), bits(ref))


def test_dequantize_out_and_autograd():
    """dequantize(out=) writes in place: an out that requires grad is refused under grad mode, and a tensor that an
    earlier op saved for backward is marked as changed (its backward then raises instead of using the new values)."""
    q = fastnf4.quantize(torch.randn(512), double_quant=False)
    a = torch.randn(512, requires_grad=True)
    saved = torch.randn(512)
    z = (a * saved).sum()  # saves ``saved`` for the gradient of a
    fastnf4.dequantize(q, out=saved)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()
    b = torch.randn(512, requires_grad=True)
    o = b * 1.0
    with pytest.raises(ValueError, match="out requires grad"):
        fastnf4.dequantize(q, out=o)
    with torch.no_grad():
        fastnf4.dequantize(q, out=o)
    assert torch.equal(bits(o), bits(fastnf4.dequantize(q)))
    with torch.inference_mode():
        fastnf4.dequantize(q, out=torch.empty(512))
