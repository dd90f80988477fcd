"""Bad input: a ValueError/TypeError that names the problem, before anything runs."""
import json
import types

import pytest
import torch

import fastnf4
from fastnf4 import NF4Weight, _ops
from fastnf4.codebooks import code_4bit
from helpers import bits


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


def _with_json(sd, **changes):
    """``sd`` with its quant_state JSON changed (None deletes a field)."""
    key = "weight.quant_state.bitsandbytes__nf4"
    fields = json.loads(bytes(sd[key].tolist()))
    for k, v in changes.items():
        if v is None:
            fields.pop(k)
        else:
            fields[k] = v
    return {**sd, key: torch.tensor(list(json.dumps(fields).encode()), dtype=torch.uint8)}


def test_weight_fields_of_the_wrong_kind_are_named():
    """(Before 6d74eba each of these got through to a crash deep inside, or to silently wrong numbers.)"""
    q = fastnf4.quantize(torch.randn(4, 64))
    # a custom table built into the weight directly: fastnf4 (as bitsandbytes' kernels) would decode with the standard
    with pytest.raises(ValueError, match="standard nf4 table"):
        NF4Weight(**good(code=torch.linspace(-1, 1, 16)))
    code = code_4bit()
    code[3] = 0.5  # (a handed-out standard table written to: looked at again)
    with pytest.raises(ValueError, match="standard nf4 table"):
        NF4Weight(**good(code=code))
    assert NF4Weight(**good(code=code_4bit().clone())).code.shape == (16,)  # the standard values in another tensor
    with pytest.raises(TypeError, match="nested_blocksize must be an int"):
        NF4Weight(**{**good(absmax=q.absmax[:2].clone()), "nested_absmax": q.nested_absmax, "nested_code": q.nested_code,
                     "offset": q.offset, "nested_blocksize": 64.0})
    with pytest.raises(TypeError, match="QuantState"):
        NF4Weight.from_bnb(q.packed, None)
    sd = q.state_dict()
    with pytest.raises(TypeError, match="weight must be a tensor"):
        NF4Weight.from_state_dict({**sd, "weight": [1, 2]})
    with pytest.raises(TypeError, match="weight.absmax must be a tensor"):
        NF4Weight.from_state_dict({**sd, "weight.absmax": 3.0})
    with pytest.raises(ValueError, match="nested_offset"):
        NF4Weight.from_state_dict(_with_json(sd, nested_offset=None))
    with pytest.raises(TypeError, match="nested_blocksize must be an int"):
        NF4Weight.from_state_dict(_with_json(sd, nested_blocksize=256.5))


def test_linear_bias_kinds_and_empty_k():
    q = fastnf4.quantize(torch.randn(8, 64), blocksize=64)
    with pytest.raises(TypeError, match="bias must be a torch.Tensor"):
        fastnf4.linear(torch.randn(2, 64), q, [0.0] * 8)
    q0 = fastnf4.quantize(torch.empty(8, 0))  # K = 0: the product is the bias, as torch's linear gives
    bias = torch.randn(8)
    x = torch.randn(3, 0)
    assert torch.equal(fastnf4.linear(x, q0, bias), torch.nn.functional.linear(x, torch.empty(8, 0), bias))
    assert torch.equal(fastnf4.linear(x, q0), torch.zeros(3, 8))


def test_dequantize_into_memory_of_the_weight_is_refused():
    n = 4096
    buf = torch.zeros(n, dtype=torch.bfloat16)
    q = fastnf4.quantize(torch.randn(n), blocksize=64, double_quant=False)
    packed = buf.view(torch.uint8)[: n // 2].view(-1, 1)  # the packed bytes inside out's own storage
    packed.copy_(q.packed)
    q2 = NF4Weight(packed=packed, absmax=q.absmax, code=q.code, blocksize=64, shape=(n,), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out overlaps the weight's packed"):
        fastnf4.dequantize(q2, out=buf)
    absmax = torch.zeros(n // 64 + n // 2, dtype=torch.float32)
    absmax[: n // 64] = q.absmax
    q3 = NF4Weight(packed=q.packed, absmax=absmax[: n // 64], code=q.code, blocksize=64, shape=(n,),
                   dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out overlaps the weight's absmax"):
        fastnf4.dequantize(q3, out=absmax[n // 64 - 4:].view(torch.bfloat16)[:n])  # its last 4 floats under out
    storage = torch.zeros(n // 2 + 2 * n, dtype=torch.uint8)  # out right after the packed bytes, not on them: fine
    storage[: n // 2].copy_(q.packed.view(-1))
    q4 = NF4Weight(packed=storage[: n // 2].view(-1, 1), absmax=q.absmax, code=q.code, blocksize=64, shape=(n,),
                   dtype=torch.bfloat16)
    out = storage[n // 2:].view(torch.bfloat16)
    assert torch.equal(fastnf4.dequantize(q4, out=out), fastnf4.dequantize(q, torch.bfloat16))


def test_linear4bit_construction_and_state_dict_loading_are_checked():
    from fastnf4.nn import Linear4bit, quantize_model

    with pytest.raises(TypeError, match="takes an NF4Weight"):
        Linear4bit(torch.randn(8, 64))
    torch.manual_seed(0)
    with_bias = Linear4bit.from_linear(torch.nn.Linear(64, 8))
    no_bias = Linear4bit.from_linear(torch.nn.Linear(64, 8, bias=False))
    with pytest.raises(RuntimeError, match="Unexpected key.*bias"):  # as nn.Linear: not dropped in silence
        no_bias.load_state_dict(with_bias.state_dict())
    other = Linear4bit.from_linear(torch.nn.Linear(32, 16))
    before = no_bias.weight_nf4
    with pytest.raises(RuntimeError, match="size mismatch for weight"):
        no_bias.load_state_dict(other.state_dict(), strict=False)
    assert no_bias.weight_nf4 is before and (no_bias.out_features, no_bias.in_features) == (8, 64)
    sd = with_bias.state_dict()
    with pytest.raises(RuntimeError, match="size mismatch for bias"):
        with_bias.load_state_dict({**sd, "bias": torch.zeros(5)})
    result = with_bias.load_state_dict({k: v for k, v in sd.items() if k != "weight.absmax"}, strict=False)
    assert result.missing_keys == ["weight.absmax"]
    fresh = Linear4bit.from_linear(torch.nn.Linear(64, 8))
    fresh.load_state_dict(sd)  # and a good one loads whole
    x = torch.randn(2, 64)
    assert torch.equal(fresh(x), with_bias(x))
    model = torch.nn.Sequential()
    model.add_module("a", torch.nn.Linear(64, 64))
    model.add_module("lm_head", torch.nn.Linear(64, 8))
    quantize_model(model, skip="lm_head")  # a name, not its letters
    assert isinstance(model.a, Linear4bit) and type(model.lm_head) is torch.nn.Linear


@pytest.mark.parametrize("call, exc, words", [
    (lambda: fastnf4.quantize(torch.ones(64), blocksize=64.0), TypeError, "blocksize must be an int, got float"),
    (lambda: fastnf4.quantize(torch.ones(64), blocksize="64"), TypeError, "blocksize must be an int, got str"),
    (lambda: fastnf4.quantize(torch.ones(64), blocksize=True), TypeError, "blocksize must be an int, got bool"),
    (lambda: fastnf4.quantize(torch.ones(64), double_quant="no"), TypeError, "double_quant must be a bool"),
    (lambda: fastnf4.quantize(torch.ones(64), quant_type=None), TypeError, "quant_type must be a str"),
    (lambda: fastnf4.quantize(torch.ones(8, 64)).to(torch.float16), TypeError, "takes a device, got the dtype"),
])
def test_argument_kinds_are_named(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


def test_numpy_integer_blocksize_is_an_int():
    np = pytest.importorskip("numpy")
    q = fastnf4.quantize(torch.randn(128), blocksize=np.int64(64))
    assert type(q.blocksize) is int and q.blocksize == 64


@pytest.mark.parametrize("field, value, exc, words", [
    ("quant_type", "fp4", ValueError, "not the standard fp4 table"),  # NF4 bytes would decode with the FP4 table
    ("code", torch.linspace(-1, 1, 16), ValueError, "not the standard nf4 table"),  # would be ignored by the kernels
    ("blocksize", 32.0, TypeError, "blocksize must be an int"),
    ("blocksize", 128, ValueError, "absmax has 2 elements, expected 1"),
    ("shape", (4, 64), ValueError, "packed holds"),
    ("dtype", torch.int8, TypeError, "dtype"),
])
def test_reassigned_fields_are_checked_and_undone(field, value, exc, words):
    q = fastnf4.quantize(torch.randn(2, 64), double_quant=False)
    ref = fastnf4.dequantize(q)
    before = getattr(q, field)
    with pytest.raises(exc, match=words):
        setattr(q, field, value)
    assert getattr(q, field) is before
    assert torch.equal(bits(fastnf4.dequantize(q)), bits(ref))


def test_consistent_reassignments_still_work():
    import dataclasses

    q = fastnf4.quantize(torch.randn(2, 64), double_quant=False)
    ref = fastnf4.dequantize(q)
    q.packed = q.packed.clone()
    q.shape = (128,)  # the same elements, another shape
    assert fastnf4.dequantize(q).shape == (128,) and torch.equal(fastnf4.dequantize(q).view(2, 64), ref)
    q2 = dataclasses.replace(q, shape=torch.Size([4, 32]))  # several fields at once
    assert torch.equal(fastnf4.dequantize(q2).view(2, 64), ref)


def test_from_bnb_rejects_malformed_quant_states():
    import types

    q = fastnf4.quantize(torch.randn(8, 64))
    good_qs = dict(absmax=q.absmax, code=q.code, blocksize=64, shape=q.shape, dtype=q.dtype, quant_type="nf4",
                   nested=True, state2=types.SimpleNamespace(absmax=q.nested_absmax, code=q.nested_code, blocksize=256),
                   offset=q.offset)
    r = NF4Weight.from_bnb(q.packed, types.SimpleNamespace(**good_qs))
    assert torch.equal(bits(fastnf4.dequantize(r)), bits(fastnf4.dequantize(q)))
    for over, exc, words in [
        (dict(blocksize=64.7), TypeError, "quant_state.blocksize must be an int"),  # not truncated to 64
        (dict(blocksize="64"), TypeError, "quant_state.blocksize must be an int"),
        (dict(state2=None), TypeError, "state2 is missing"),
        (dict(offset=torch.tensor([1.0, 2.0])), ValueError, "offset must hold one value"),
        (dict(offset=None), TypeError, "offset must be a tensor or a number"),
    ]:
        with pytest.raises(exc, match=words):
            NF4Weight.from_bnb(q.packed, types.SimpleNamespace(**{**good_qs, **over}))
    with pytest.raises(TypeError, match="packed must be a torch.Tensor"):
        NF4Weight.from_bnb([1, 2], types.SimpleNamespace(**good_qs))


def test_meta_device_weights_give_shapes_or_named_errors():
    from fastnf4.nn import Linear4bit

    q = fastnf4.quantize(torch.randn(8, 64)).to("meta")  # (the table check needs values: skipped on meta)
    assert q.device.type == "meta" and fastnf4.dequantize(q).shape == (8, 64)
    assert fastnf4.linear(torch.randn(3, 64, device="meta"), q).shape == (3, 8)
    layer = Linear4bit.from_linear(torch.nn.Linear(64, 8)).to("meta")
    assert layer(torch.randn(2, 5, 64, device="meta")).shape == (2, 5, 8)
    with pytest.raises(ValueError, match="meta device"):
        q.state_dict()


def test_linear4bit_arguments_are_checked_at_construction():
    from fastnf4.nn import Linear4bit

    q = fastnf4.quantize(torch.randn(8, 64))
    with pytest.raises(TypeError, match="compute_dtype must be"):
        Linear4bit(q, compute_dtype=torch.int8)
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        Linear4bit(q, bias=torch.zeros(5))


def test_quantize_model_checks_first_and_names_the_layer():
    from fastnf4.nn import Linear4bit, quantize_model

    model = torch.nn.Sequential(torch.nn.Linear(64, 8), torch.nn.Linear(8, 8).double())
    with pytest.raises(TypeError, match="layer 1: quantize takes"):
        quantize_model(model)
    assert type(model[0]) is torch.nn.Linear  # nothing replaced
    one = lambda: torch.nn.Sequential(torch.nn.Linear(64, 8))  # noqa: E731
    for skip, exc, words in [(None, TypeError, "skip must be a str or an iterable"), ([1], TypeError, "str patterns"),
                             (["(("], ValueError, "not a valid regular expression")]:
        with pytest.raises(exc, match=words):
            quantize_model(one(), skip=skip)
    with pytest.raises(TypeError, match="takes a torch.nn.Module"):
        quantize_model([torch.nn.Linear(64, 8)])
    model = one()
    quantize_model(model, skip=())
    assert isinstance(model[0], Linear4bit)


def test_a_table_copy_inside_a_graph_capture_is_named(monkeypatch):
    """The per-device code tables are copied to a GPU on first use; inside a CUDA graph capture that copy is not
    allowed, so fastnf4 says what to do instead of torch's pinned-memory error (simulated: no GPU needed)."""
    from fastnf4 import codebooks

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(codebooks, "_device_cache", {})
    with pytest.raises(RuntimeError, match="make one fastnf4 call on this device .or build its NF4Weight there. "
                                           "before capturing"):
        codebooks.kernel_code("nf4", torch.device("cuda", 0))


# ------------------------------------------------------------------- bad input found by trying it as a new user would
def _sd():
    return fastnf4.quantize(torch.randn(8, 64, generator=torch.Generator().manual_seed(0))).state_dict()


def _with_raw_json(text):
    return {**_sd(), "weight.quant_state.bitsandbytes__nf4": torch.tensor(list(text.encode()), dtype=torch.uint8)}


def _with_fields(**changes):
    fields = json.loads(bytes(_sd()["weight.quant_state.bitsandbytes__nf4"].tolist()))
    return _with_raw_json(json.dumps({**fields, **changes}))  # (json.dumps writes NaN / Infinity as Python does)


def _quant_state(state2=None, **over):
    """(packed, a QuantState-like namespace) of a double-quantized weight; ``state2``: changes to its state2."""
    q = fastnf4.quantize(torch.randn(8, 64, generator=torch.Generator().manual_seed(0)))
    s2 = dict(absmax=q.nested_absmax, code=q.nested_code, blocksize=256, dtype=torch.float32)
    fields = dict(absmax=q.absmax, code=q.code, blocksize=64, shape=q.shape, dtype=q.dtype, quant_type="nf4",
                  nested=True, state2=types.SimpleNamespace(**{**s2, **(state2 or {})}), offset=q.offset)
    return q.packed, types.SimpleNamespace(**{**fields, **over})


def _inf_offset_weight():
    w = torch.randn(4, 64)
    w[0, 0] = float("inf")  # the block's absmax is Inf, so is the offset (their mean)
    return fastnf4.quantize(w)


_DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("call, exc, words", [
    pytest.param(lambda: fastnf4.quantize(torch.ones(64), blocksize=2**70), ValueError, "unsupported blocksize",
                 id="quantize-blocksize-beyond-int64"),
    pytest.param(lambda: fastnf4.quantize(torch.ones(64), blocksize=-2**63 - 1), ValueError, "unsupported blocksize",
                 id="quantize-blocksize-below-int64"),
    pytest.param(lambda: fastnf4.quantize(torch.ones(64), double_quant=2), TypeError, "double_quant must be a bool",
                 id="quantize-double_quant-2"),
    pytest.param(lambda: NF4Weight.from_state_dict(_with_fields(nested_offset=10**400)), ValueError,
                 "nested_offset 1000.* is out of the float range", id="json-offset-401-digits"),
    pytest.param(lambda: NF4Weight.from_state_dict(_with_raw_json(_DEEP)), ValueError, "nested too deeply",
                 id="json-nested-too-deeply"),
    pytest.param(lambda: NF4Weight.from_state_dict(_with_fields(nested_offset=float("nan"))), ValueError,
                 "nested_offset must be finite", id="json-offset-NaN"),
    pytest.param(lambda: NF4Weight.from_state_dict(_with_fields(nested_offset=float("inf"))), ValueError,
                 "nested_offset must be finite", id="json-offset-Infinity"),
    pytest.param(lambda: NF4Weight.from_state_dict(_with_fields(nested_offset=-float("inf"))), ValueError,
                 "nested_offset must be finite", id="json-offset--Infinity"),
    pytest.param(lambda: NF4Weight.from_state_dict(_with_fields(nested_offset=1e300)), ValueError,
                 r"finite \(as a float32\)", id="json-offset-beyond-float32"),
    pytest.param(lambda: NF4Weight.from_state_dict(_with_fields(padding="x" * 2_000_000)), ValueError,
                 "a quant_state JSON is a few hundred", id="json-2MB"),
    pytest.param(lambda: NF4Weight.from_state_dict(_with_fields(shape=[2**70])), ValueError,
                 "shape .* has a dimension out of range", id="json-shape-beyond-int64"),
    pytest.param(lambda: NF4Weight.from_state_dict({**_sd(), "weight.quant_state.bitsandbytes__nf4":
                                                    _sd()["weight.quant_state.bitsandbytes__nf4"].to("meta")}),
                 ValueError, "meta device: its JSON has no bytes", id="json-on-meta"),
    pytest.param(lambda: NF4Weight.from_state_dict(list(_sd().items())), TypeError, "takes a mapping",
                 id="state-dict-a-list"),
    pytest.param(lambda: NF4Weight.from_state_dict(_sd(), None), TypeError, "prefix must be a str",
                 id="from-state-dict-prefix-None"),
    pytest.param(lambda: NF4Weight.from_state_dict(_sd(), device="cuda:99"), ValueError, "is not available",
                 id="from-state-dict-absent-device"),
    pytest.param(lambda: NF4Weight.from_state_dict(_sd(), device="nodevice"), ValueError, "is not available",
                 id="from-state-dict-unknown-device"),
    pytest.param(lambda: fastnf4.quantize(torch.randn(8, 64)).state_dict(None), TypeError, "prefix must be a str",
                 id="state-dict-prefix-None"),
    pytest.param(lambda: _inf_offset_weight().state_dict(), ValueError, "decodes to NaN everywhere",
                 id="state-dict-of-an-Inf-offset"),
    pytest.param(lambda: fastnf4.quantize(torch.randn(8, 64)).to("cuda:99"), ValueError, "is not available",
                 id="to-absent-device"),
    pytest.param(lambda: NF4Weight(**good(shape=(2**70,))), ValueError, "shape .* has a dimension out of range",
                 id="shape-beyond-int64"),
    pytest.param(lambda: NF4Weight(**good(shape=(True, 128))), TypeError, "every entry of shape must be an int, got bool",
                 id="shape-of-bools"),
    pytest.param(lambda: NF4Weight(**good(shape=(2.0, 64.0))), TypeError, "every entry of shape must be an int",
                 id="shape-of-floats"),
    pytest.param(lambda: NF4Weight(**good(shape="2, 64")), TypeError, "shape must be a sequence of ints",
                 id="shape-a-str"),
    pytest.param(lambda: NF4Weight(**good(packed=torch.zeros(64, 1, dtype=torch.bool))), TypeError,
                 "unsupported storage dtype torch.bool", id="packed-bool"),
    pytest.param(lambda: NF4Weight(**good(packed=torch.zeros(8, 1, dtype=torch.complex64))), TypeError,
                 "unsupported storage dtype torch.complex64", id="packed-complex"),
    pytest.param(lambda: NF4Weight.from_bnb(*_quant_state(offset=10**400)), ValueError, "out of the float range",
                 id="from-bnb-offset-401-digits"),
    pytest.param(lambda: NF4Weight.from_bnb(*_quant_state(offset=torch.empty((), device="meta"))), ValueError,
                 "offset is on meta", id="from-bnb-offset-on-meta"),
    pytest.param(lambda: NF4Weight.from_bnb(*_quant_state(nested="no")), TypeError, "nested must be a bool",
                 id="from-bnb-nested-a-str"),
    pytest.param(lambda: NF4Weight.from_bnb(*_quant_state(nested=torch.tensor([True, False]))), TypeError,
                 "nested must be a bool", id="from-bnb-nested-a-tensor"),
    pytest.param(lambda: NF4Weight.from_bnb(*_quant_state(offset=torch.tensor(1))), TypeError,
                 "offset must be a floating-point tensor", id="from-bnb-offset-int-tensor"),
    pytest.param(lambda: NF4Weight.from_bnb(*_quant_state(state2=dict(absmax=torch.ones(1, dtype=torch.float64)))),
                 TypeError, "nested_absmax must be float32, float16 or bfloat16", id="from-bnb-nested-absmax-float64"),
    pytest.param(lambda: NF4Weight.from_bnb(*_quant_state(state2=dict(dtype=torch.int8))), TypeError,
                 "state2.dtype must be one of", id="from-bnb-state2-dtype-int8"),
    pytest.param(lambda: NF4Weight.from_state_dict(_with_fields(nested_dtype="int8")), ValueError,
                 "nested_dtype: unsupported dtype 'int8'", id="json-nested-dtype-int8"),
])
def test_bad_input_is_a_value_or_type_error(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


def test_state_dict_keys_that_are_not_str_are_not_this_weights():
    q = fastnf4.quantize(torch.randn(8, 64))
    r = NF4Weight.from_state_dict({**q.state_dict(), 5: torch.ones(1), ("a",): torch.ones(1)})
    assert torch.equal(bits(fastnf4.dequantize(r)), bits(fastnf4.dequantize(q)))


@pytest.mark.parametrize("build", ["quantize", "Linear4bit.from_linear", "quantize_model"])
def test_blocksize_beyond_int64_through_the_layers(build):
    from fastnf4.nn import Linear4bit, quantize_model

    calls = {"quantize": lambda: fastnf4.quantize(torch.randn(8, 64), blocksize=2**64),
             "Linear4bit.from_linear": lambda: Linear4bit.from_linear(torch.nn.Linear(64, 8), blocksize=2**64),
             "quantize_model": lambda: quantize_model(torch.nn.Sequential(torch.nn.Linear(64, 8)), blocksize=2**64)}
    with pytest.raises(ValueError, match="unsupported blocksize 18446744073709551616"):
        calls[build]()
