"""Bad input: a ValueError/TypeError that names the problem, before anything runs."""
import json

import pytest
import torch

import fastnf4
from fastnf4 import NF4Weight, _ops
from fastnf4.codebooks import code_4bit


def good(**over):
    kw = dict(packed=torch.zeros(64, 1, dtype=torch.uint8), absmax=torch.ones(2), code=code_4bit(), blocksize=64,
              shape=(2, 64), dtype=torch.bfloat16)
    kw.update(over)
    return kw


@pytest.mark.parametrize("over, exc, words", [
    (dict(blocksize=48), ValueError, "blocksize"),
    (dict(quant_type="int4"), ValueError, "quant_type"),
    (dict(dtype=torch.int8), TypeError, "dtype"),
    (dict(shape=(3, 64)), ValueError, "packed holds 64 bytes"),
    (dict(absmax=torch.ones(3)), ValueError, "absmax has 3"),
    (dict(absmax=torch.ones(2, dtype=torch.float16)), TypeError, "absmax must have dtype"),
    (dict(code=torch.ones(8)), ValueError, "code"),
    (dict(packed=torch.zeros(2, 64, dtype=torch.uint8).t()), ValueError, "contiguous"),
    (dict(nested_absmax=torch.ones(1)), ValueError, "together"),
])
def test_nf4weight_rejects(over, exc, words):
    with pytest.raises(exc, match=words):
        NF4Weight(**good(**over))


def test_device_mismatch_is_named():
    meta = torch.ones(2, device="meta")
    with pytest.raises(ValueError, match="absmax is on meta"):
        NF4Weight(**good(absmax=meta))


@pytest.mark.parametrize("call, exc, words", [
    (lambda: fastnf4.quantize(torch.ones(64, dtype=torch.int32)), TypeError, "quantize takes"),
    (lambda: fastnf4.quantize(torch.ones(64), blocksize=100), ValueError, "blocksize 100"),
    (lambda: fastnf4.quantize(torch.ones(64), quant_type="nf3"), ValueError, "quant_type"),
    (lambda: fastnf4.quantize(torch.ones(8, 64).t()), ValueError, "contiguous"),
    (lambda: fastnf4.quantize([1.0, 2.0]), TypeError, "torch.Tensor"),
    (lambda: fastnf4.dequantize(torch.ones(3)), TypeError, "NF4Weight"),
    (lambda: fastnf4.dequantize(NF4Weight(**good()), dtype=torch.int8), TypeError, "dtype"),
    (lambda: fastnf4.dequantize(NF4Weight(**good()), out=torch.empty(127)), ValueError, "out has 127"),
    (lambda: fastnf4.dequantize(NF4Weight(**good()), out=torch.empty(256)[::2]), ValueError, "contiguous"),
    (lambda: fastnf4.dequantize(NF4Weight(**good()), dtype=torch.float16, out=torch.empty(128)), TypeError, "out has dtype"),
])
def test_api_rejects(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


def test_raw_op_checks_sizes_before_launching():
    packed, absmax, code = torch.zeros(10, dtype=torch.uint8), torch.ones(1), code_4bit()
    with pytest.raises(ValueError, match="shape/packed size mismatch"):
        _ops.dequantize_4bit(packed, absmax, code, 64, 100, torch.bfloat16, None, None, None, 256)
    with pytest.raises(ValueError, match="absmax has 1 entries, expected 2"):
        _ops.dequantize_4bit(torch.zeros(50, dtype=torch.uint8), absmax, code, 64, 100, torch.bfloat16, None, None, None, 256)


def test_state_dict_problems_are_named():
    q = fastnf4.quantize(torch.randn(4, 64))
    sd = q.state_dict()
    with pytest.raises(KeyError, match="no 'p.weight'"):
        NF4Weight.from_state_dict(sd, "p.")
    bad = dict(sd)
    bad["weight.quant_state.bitsandbytes__nf4"] = torch.tensor(list(b"{not json"), dtype=torch.uint8)
    with pytest.raises(ValueError, match="valid JSON"):
        NF4Weight.from_state_dict(bad)
    fields = json.loads(bytes(sd["weight.quant_state.bitsandbytes__nf4"].tolist()))
    fields["dtype"] = "complex64"
    bad["weight.quant_state.bitsandbytes__nf4"] = torch.tensor(list(json.dumps(fields).encode()), dtype=torch.uint8)
    with pytest.raises(ValueError, match="unsupported dtype"):
        NF4Weight.from_state_dict(bad)
    bad = dict(sd)
    bad["weight.quant_map"] = torch.linspace(-1, 1, 16)
    with pytest.raises(ValueError, match="quant_map"):
        NF4Weight.from_state_dict(bad)
