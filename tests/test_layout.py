"""The fastnf4 layout of the packed bytes (``fastnf4/layouts.py``): the permutation against its index formula, lossless
conversion both ways, every API on both layouts (bit for bit the same results), the layers' repack and state dicts,
and the savers. CPU: the Triton kernels through the interpreter where tests/conftest.py turns it on, and the
pure-PyTorch reference."""
import copy
import dataclasses
import gc
import json
import pickle
import weakref

import pytest
import torch

import fastnf4
from fastnf4 import _ops, _triton, layouts
from fastnf4.format import NF4Weight
from fastnf4.nn import Linear4bit, RepackCounts, repack_model
from helpers import bits

SHAPES = [(16, 64), (48, 192), (32, 128), (64, 256)]


def _random_bytes(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n * k // 2,), dtype=torch.uint8, generator=g)


def _weight(n, k, blocksize=64, nested=True, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.05).to(dtype)
    return fastnf4.quantize(w, blocksize=blocksize, double_quant=nested)


@pytest.fixture(params=["kernel", "reference"])
def path(request, monkeypatch):
    """The Triton kernels (interpreter) or the pure-PyTorch reference."""
    if request.param == "reference":
        monkeypatch.setattr(_triton, "use_triton", lambda device: False)
    elif not _triton.use_triton(torch.device("cpu")):
        pytest.skip("needs TRITON_INTERPRET=1")
    return request.param


# ------------------------------------------------------------------------------------------------ the permutation
@pytest.mark.parametrize("n,k", SHAPES)
def test_permutation_is_the_index_formula(n, k):
    """Each byte of the fastnf4 layout, by the docstring's formula written out as loops (not the permute)."""
    old = _random_bytes(n, k).tolist()
    new = layouts.from_bnb_order(torch.tensor(old, dtype=torch.uint8), n, k)
    assert new.dtype == torch.uint8 and tuple(new.shape) == (n // 16, k // 64, 512)
    new = new.tolist()
    row_bytes = k // 2
    for i in range(n // 16):
        for j in range(k // 64):
            for lane in range(32):
                g, t = lane // 4, lane % 4
                for s in range(4):
                    for e in range(4):
                        r = 16 * i + g + 8 * (e % 2)
                        c = 32 * j + 8 * t + 2 * s + e // 2
                        assert new[i][j][16 * lane + 4 * s + e] == old[r * row_bytes + c], (i, j, lane, s, e)


@pytest.mark.parametrize("n,k", SHAPES + [(160, 640)])
def test_conversion_is_lossless_both_ways(n, k):
    old = _random_bytes(n, k, seed=n + k)
    new = layouts.from_bnb_order(old.view(-1, 1), n, k)
    assert new.numel() == old.numel()  # the same bytes, moved
    back = layouts.to_bnb_order(new)
    assert back.dtype == torch.uint8 and tuple(back.shape) == (n * k // 2, 1)
    assert torch.equal(back.view(-1), old)
    # the brief's torch expression of the inverse, as written in docs/design.md
    inv = new.view(n // 16, k // 64, 8, 4, 4, 2, 2).permute(0, 6, 2, 1, 3, 4, 5).reshape(-1)
    assert torch.equal(inv, old)


def test_a_lane_holds_its_mma_fragments():
    """Lane l's 16 bytes are its A-operand fragments of mma.m16n8k16 for the four k steps: registers a0..a3 of step
    s hold rows g / g+8 at the step's columns 2t, 2t+1 and 2t+8, 2t+9, which are elements 16t + 4s + 0, 1 (byte
    8t + 2s) and 16t + 4s + 2, 3 (byte 8t + 2s + 1): lane t's bytes are elements 16t .. 16t + 15 of both rows."""
    n, k = 16, 64
    old = _random_bytes(n, k).view(n, k // 2)
    tile = layouts.from_bnb_order(old, n, k)[0, 0]
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for s in range(4):
            want = [old[g, 8 * t + 2 * s], old[g + 8, 8 * t + 2 * s], old[g, 8 * t + 2 * s + 1],
                    old[g + 8, 8 * t + 2 * s + 1]]
            assert tile[16 * lane + 4 * s: 16 * lane + 4 * s + 4].tolist() == [int(v) for v in want]


# ---------------------------------------------------------------------------------------------- NF4Weight / repack
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("nested", [False, True])
def test_repack_round_trip_gives_bitsandbytes_bytes(n, k, nested):
    q = _weight(n, k, nested=nested)
    assert q.layout == "bnb" and fastnf4.LAYOUTS == ("bnb", "fastnf4")
    r = fastnf4.repack(q, "fastnf4")
    assert r.layout == "fastnf4" and r.packed.dtype == torch.uint8 and tuple(r.packed.shape) == (n // 16, k // 64, 512)
    assert r.packed.numel() == n * k // 2 and r.nbytes() == q.nbytes()
    for f in ("absmax", "code", "nested_absmax", "nested_code", "offset"):  # the statistics are shared, unchanged
        assert getattr(r, f) is getattr(q, f)
    assert fastnf4.repack(r, "fastnf4") is r and fastnf4.repack(q, "bnb") is q  # no-ops
    b = fastnf4.repack(r, "bnb")
    assert b.layout == "bnb" and tuple(b.packed.shape) == tuple(q.packed.shape) and torch.equal(b.packed, q.packed)
    assert torch.equal(r.bnb_packed(), q.packed) and r.bnb_packed("cpu").shape == q.packed.shape


def test_repack_of_another_quant_storage():
    """bitsandbytes' quant_storage (here bfloat16) holds the same bytes: the round trip gives them back as uint8."""
    q = _weight(32, 128)
    q16 = dataclasses.replace(q, packed=q.packed.view(-1).view(torch.bfloat16).view(-1, 1))
    r = fastnf4.repack(q16, "fastnf4")
    assert r.packed.dtype == torch.uint8 and torch.equal(r.packed, fastnf4.repack(q, "fastnf4").packed)
    assert torch.equal(fastnf4.repack(r, "bnb").packed_u8, q16.packed_u8)


def test_the_layout_survives_copies_and_moves():
    r = fastnf4.repack(_weight(48, 192), "fastnf4")
    for c in (copy.copy(r), copy.deepcopy(r), r.to("cpu"), r.to(torch.device("cpu")), pickle.loads(pickle.dumps(r)),
              r.map_tensors(lambda t: t.clone())):
        assert c.layout == "fastnf4" and torch.equal(c.packed, r.packed)
        c.validate()
    assert "layout='fastnf4'" in repr(r) and "layout" not in repr(_weight(16, 64))


def test_validate_checks_the_3d_shape():
    q = _weight(48, 192)
    r = fastnf4.repack(q, "fastnf4")
    with pytest.raises(ValueError, match=r"must have shape \(3, 3, 512\)"):
        dataclasses.replace(r, packed=r.packed.reshape(3, 6, 256))
    with pytest.raises(ValueError, match=r"must have shape \(3, 3, 512\)"):
        dataclasses.replace(r, packed=r.packed.reshape(9, 1, 512))
    with pytest.raises(TypeError, match="must be uint8"):
        dataclasses.replace(r, packed=r.packed.view(torch.int8))
    with pytest.raises(ValueError, match="N % 16 == 0 and K % 64 == 0"):  # a 3-D packed for a shape that cannot be
        dataclasses.replace(_weight(24, 128), packed=torch.zeros(1, 2, 768, dtype=torch.uint8))
    with pytest.raises(ValueError, match="needs a 2-D weight"):
        NF4Weight(packed=r.packed, absmax=q.absmax, code=q.code, blocksize=64, shape=(48, 3, 64), dtype=q.dtype,
                  nested_absmax=q.nested_absmax, nested_code=q.nested_code, offset=q.offset)
    with pytest.raises(ValueError, match="inconsistent weight"):  # a field set afterwards is checked too
        r.packed = r.packed.reshape(3, 6, 256)
    assert r.layout == "fastnf4" and tuple(r.packed.shape) == (3, 3, 512)
    r.packed = q.packed  # back to the bnb layout by assignment: a valid weight
    assert r.layout == "bnb"


def test_repack_errors():
    q = _weight(48, 192)
    with pytest.raises(TypeError, match="repack takes an NF4Weight"):
        fastnf4.repack(q.packed, "fastnf4")
    with pytest.raises(ValueError, match="unknown layout 'marlin'"):
        fastnf4.repack(q, "marlin")
    with pytest.raises(TypeError, match="layout must be a str"):
        fastnf4.repack(q, None)
    for shape, what in [((24, 64), "N % 16 = 8"), ((16, 96), "K % 64 = 32"), ((16, 4, 64), "2-D"), ((1024,), "2-D")]:
        g = torch.Generator().manual_seed(0)
        w = torch.randn(*shape, generator=g).to(torch.bfloat16)
        with pytest.raises(ValueError, match=what):
            fastnf4.repack(fastnf4.quantize(w), "fastnf4")
        if len(shape) == 2:
            layer = Linear4bit(fastnf4.quantize(w))
            with pytest.raises(ValueError, match="cannot repack"):
                layer.repack("fastnf4")
            assert layer.layout == "bnb"


def test_bitsandbytes_readers_refuse_a_3d_packed():
    r = fastnf4.repack(_weight(48, 192), "fastnf4")
    sd = r.state_dict()
    sd["weight"] = r.packed
    with pytest.raises(ValueError, match="bitsandbytes' packed weights are"):
        NF4Weight.from_state_dict(sd)


# ------------------------------------------------------------------------------------------- dequantize and linear
@pytest.mark.parametrize("n,k", [(16, 64), (48, 192)])
@pytest.mark.parametrize("blocksize", [64, 128])
@pytest.mark.parametrize("nested", [False, True])
def test_dequantize_is_the_same_on_both_layouts(path, n, k, blocksize, nested):
    q = _weight(n, k, blocksize, nested, seed=blocksize)
    r = fastnf4.repack(q, "fastnf4")
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        ref = fastnf4.dequantize(q, dtype)
        got = fastnf4.dequantize(r, dtype)
        assert got.shape == (n, k) and torch.equal(bits(got), bits(ref))
        out = torch.full((n, k), float("nan"), dtype=dtype)
        assert torch.equal(bits(fastnf4.dequantize(r, out=out)), bits(ref))
    # the ops themselves, through their dispatch (the eager API skips it)
    args = (r.absmax, fastnf4.codebooks.kernel_code("nf4", torch.device("cpu")), blocksize, n * k, torch.bfloat16,
            r.nested_code, r.nested_absmax, r.offset, r.nested_blocksize)
    assert torch.equal(bits(_ops.dequantize_4bit(r.packed, *args)), bits(fastnf4.dequantize(q).view(-1)))


@pytest.mark.parametrize("n,k", [(16, 64), (48, 192)])
@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("xdtype", [torch.float16, torch.bfloat16])
def test_linear_is_the_same_on_both_layouts(path, n, k, nested, xdtype):
    q = _weight(n, k, 64 if nested else 128, nested, dtype=xdtype, seed=k)
    r = fastnf4.repack(q, "fastnf4")
    g = torch.Generator().manual_seed(1)
    bias = torch.randn(n, generator=g).to(xdtype)
    for m in (1, 3, 40):
        x = torch.randn(m, k, generator=g).to(xdtype)
        assert torch.equal(bits(fastnf4.linear(x, r)), bits(fastnf4.linear(x, q))), m
        assert torch.equal(bits(fastnf4.linear(x, r, bias)), bits(fastnf4.linear(x, q, bias))), m
    x = torch.randn(2, 5, k, generator=g).to(xdtype)
    y = fastnf4.linear(x, r)
    assert y.shape == (2, 5, n) and torch.equal(bits(y), bits(fastnf4.linear(x, q)))


def test_decoded_nested_statistics_on_both_layouts():
    """A weight with bfloat16 double-quant statistics (decoded at load, kept as read): repack keeps them, and the
    state dict gives them back unchanged."""
    sd = _weight(48, 192).state_dict()
    key = "weight.quant_state.bitsandbytes__nf4"
    fields = json.loads(bytes(sd[key].tolist()))
    fields["nested_dtype"] = "bfloat16"
    sd[key] = torch.tensor(list(json.dumps(fields).encode()), dtype=torch.uint8)
    q = NF4Weight.from_state_dict(sd)
    assert q.nested_stats is not None
    r = fastnf4.repack(q, "fastnf4")
    assert r.nested_stats is q.nested_stats
    assert torch.equal(bits(fastnf4.dequantize(r)), bits(fastnf4.dequantize(q)))
    x = torch.randn(3, 192).to(torch.bfloat16)
    assert torch.equal(bits(fastnf4.linear(x, r)), bits(fastnf4.linear(x, q)))
    out = r.state_dict()
    assert out.keys() == sd.keys() and all(torch.equal(out[k_], sd[k_]) for k_ in sd)


@pytest.mark.parametrize("nested", [False, True])
def test_autograd_on_both_layouts(nested):
    q = _weight(48, 192, nested=nested)
    r = fastnf4.repack(q, "fastnf4")
    grads = []
    for w in (q, r):
        x = torch.randn(4, 192, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).requires_grad_()
        b = torch.zeros(48, dtype=torch.bfloat16, requires_grad=True)
        (fastnf4.linear(x, w, b).float() ** 2).sum().backward()
        grads.append((x.grad, b.grad))
    assert torch.equal(bits(grads[0][0]), bits(grads[1][0])) and torch.equal(bits(grads[0][1]), bits(grads[1][1]))


def test_the_ops_on_a_3d_packed_pass_opcheck():
    """Schema, fake (meta) implementation and autograd registration of the ops with the fastnf4 layout."""
    r = fastnf4.repack(_weight(16, 64), "fastnf4")
    code = fastnf4.codebooks.kernel_code("nf4", torch.device("cpu"))
    nested = (r.nested_code, r.nested_absmax, r.offset, r.nested_blocksize)
    x = torch.randn(2, 64).to(torch.bfloat16).requires_grad_()
    torch.library.opcheck(_ops.linear_op, (x, r.packed, r.absmax, code, 64, 16, 64, *nested, None))
    torch.library.opcheck(_ops.dequantize_4bit, (r.packed, r.absmax, code, 64, 16 * 64, torch.float16, *nested))
    out = torch.empty(16 * 64, dtype=torch.bfloat16)
    torch.library.opcheck(_ops.dequantize_4bit_out, (r.packed, r.absmax, code, 64, 16 * 64, *nested, out))


def test_meta_weights_in_the_fastnf4_layout():
    r = fastnf4.repack(_weight(48, 192), "fastnf4").to("meta")
    assert r.layout == "fastnf4"
    y = fastnf4.linear(torch.empty(7, 192, dtype=torch.bfloat16, device="meta"), r)
    assert y.shape == (7, 48) and y.is_meta
    assert fastnf4.dequantize(r).shape == (48, 192)
    assert fastnf4.repack(r, "bnb").packed.shape == (48 * 192 // 2, 1)  # (the permute needs no values)


def test_the_ops_check_a_3d_packed():
    r = fastnf4.repack(_weight(48, 192), "fastnf4")
    code = fastnf4.codebooks.kernel_code("nf4", torch.device("cpu"))
    nested = (r.nested_code, r.nested_absmax, r.offset, r.nested_blocksize)
    x = torch.randn(2, 192).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"must have shape \(1, 9, 512\)"):  # the same bytes, tiles of another [n, k]
        _ops.linear(torch.randn(2, 576).to(torch.bfloat16), r.packed, r.absmax, code, 64, 16, 576, *nested, None)
    with pytest.raises(ValueError, match="K % 64 = 32"):
        _ops.linear(torch.randn(2, 96).to(torch.bfloat16), r.packed, r.absmax, code, 64, 96, 96, *nested, None)
    with pytest.raises(ValueError, match="fastnf4 layout"):
        _ops.linear(x, r.packed.view(9, 1, 512), r.absmax, code, 64, 48, 192, *nested, None)
    with pytest.raises(ValueError, match=r"\[N/16, K/64, 512\]"):
        _ops.dequantize_4bit(r.packed.view(3, 6, 256), r.absmax, code, 64, 48 * 192, torch.bfloat16, *nested)
    with pytest.raises(ValueError, match="numel is 9000"):
        _ops.dequantize_4bit(r.packed, r.absmax, code, 64, 9000, torch.bfloat16, *nested)


# ------------------------------------------------------------------------------------------------ layers and models
class _Model(torch.nn.Module):
    """Linear4bit layers of shapes that take the fastnf4 layout and two that cannot, plus a dense layer."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)

        def layer(n, k, nested=True, blocksize=64):
            lin = torch.nn.Linear(k, n, dtype=torch.bfloat16)
            with torch.no_grad():
                lin.weight.copy_(torch.randn(n, k, generator=g) * 0.05)
                lin.bias.copy_(torch.randn(n, generator=g))
            return Linear4bit.from_linear(lin, blocksize=blocksize, double_quant=nested)

        self.a = layer(64, 128)
        self.b = layer(48, 192, nested=False, blocksize=128)
        self.odd_n = layer(40, 64)  # N % 16 != 0
        self.odd_k = layer(32, 96)  # K % 64 != 0
        self.c = layer(64, 64)
        self.dense = torch.nn.Linear(64, 16, dtype=torch.bfloat16)

    def forward(self, x):
        h = self.a(torch.cat([x, x], -1))  # [.., 64]
        return torch.cat([self.b(torch.cat([h, h, h], -1)), self.dense(self.c(h)), self.odd_k(torch.cat([h, h[:, :32]], -1)),
                          self.odd_n(h)], -1)


def _tensor_bytes(model):
    seen, total = set(), 0
    tensors = list(model.parameters()) + list(model.buffers())
    for m in model.modules():
        if isinstance(m, Linear4bit):
            q = m.weight_nf4
            tensors += [getattr(q, f) for f in ("packed", "absmax", "code", "nested_absmax", "nested_code", "offset")]
    for t in tensors:
        if t is not None and id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def test_repack_model_same_bytes_skips_what_cannot_take_it():
    model = _Model()
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    with torch.no_grad():
        ref = model(x)
    sd = {k: v.clone() for k, v in model.state_dict().items()}  # (the state dict holds the bnb-layout packed tensors)
    before = _tensor_bytes(model)
    old = weakref.ref(model.a.weight_nf4.packed)
    counts = repack_model(model)
    assert isinstance(counts, RepackCounts) and counts == (3, 0, ("odd_n", "odd_k"))
    gc.collect()
    assert old() is None  # the bnb bytes are gone: no second copy kept
    assert [m.layout for m in (model.a, model.b, model.c, model.odd_n, model.odd_k)] == ["fastnf4"] * 3 + ["bnb"] * 2
    assert _tensor_bytes(model) == before
    assert "layout=fastnf4" in repr(model.a) and "layout" not in repr(model.odd_n)
    with torch.no_grad():
        assert torch.equal(bits(model(x)), bits(ref))
    # the state dict is the bnb one of before, bit for bit and key for key
    after = model.state_dict()
    assert after.keys() == sd.keys()
    for k in sd:
        assert after[k].dtype == sd[k].dtype and after[k].shape == sd[k].shape and torch.equal(after[k], sd[k]), k
    assert repack_model(model) == (0, 3, ("odd_n", "odd_k"))  # again: nothing to do
    assert repack_model(model, "bnb") == (3, 2, ())
    assert all(m.layout == "bnb" for m in model.modules() if isinstance(m, Linear4bit))
    assert all(torch.equal(model.state_dict()[k], sd[k]) for k in sd)
    with pytest.raises(ValueError, match="unknown layout"):
        repack_model(model, "fastnf5")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        repack_model(model.a.weight_nf4)


def test_layer_repack_moves_and_load_state_dict_keep_the_layout():
    model = _Model()
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    other = _Model()
    assert other.a.repack("fastnf4") is other.a
    other.b.repack()
    other.load_state_dict(sd)  # bnb bytes into layers in the fastnf4 layout: converted, the layout kept
    assert other.a.layout == other.b.layout == "fastnf4" and other.c.layout == "bnb"
    assert torch.equal(other.a.weight_nf4.packed, fastnf4.repack(model.a.weight_nf4, "fastnf4").packed)
    assert all(torch.equal(other.state_dict()[k], sd[k]) for k in sd)
    moved = copy.deepcopy(other).to("cpu").cpu()
    assert moved.a.layout == "fastnf4" and moved.a.weight.shape == (4, 2, 512)
    with torch.no_grad():
        x = torch.randn(2, 64).to(torch.bfloat16)
        assert torch.equal(bits(moved(x)), bits(model(x)))


def test_to_bnb_gives_bitsandbytes_bytes():
    F = pytest.importorskip("bitsandbytes.functional")
    q = _weight(48, 192)
    r = fastnf4.repack(q, "fastnf4")
    packed, qs = r.to_bnb()
    assert packed.shape == q.packed.shape and torch.equal(packed, q.packed)
    assert torch.equal(bits(F.dequantize_4bit(packed, qs)), bits(fastnf4.dequantize(q)))
    back = NF4Weight.from_bnb(packed, qs)
    assert back.layout == "bnb"


def test_save_quantized_of_a_repacked_model(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from fastnf4.integrations.transformers import load_quantized, save_quantized

    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = fastnf4.quantize_model(transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval())
    save_quantized(model, str(tmp_path / "bnb"))
    counts = fastnf4.repack_model(model)
    assert counts.repacked == 7 and not counts.skipped
    save_quantized(model, str(tmp_path / "repacked"))
    from safetensors.torch import load_file

    a, b = load_file(str(tmp_path / "bnb" / "model.safetensors")), load_file(str(tmp_path / "repacked" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    loaded = load_quantized(str(tmp_path / "repacked"), device="cpu")
    ref = load_quantized(str(tmp_path / "bnb"), device="cpu")
    ids = torch.randint(0, 96, (1, 5))
    with torch.no_grad():  # (not against the model itself, repacked or not: its rotary inv_freq buffer was cast to
        # bfloat16 by .to(), a loaded skeleton's stays float32, so the logits differ in a few last bits)
        assert torch.equal(bits(loaded(ids).logits), bits(ref(ids).logits))
    sd, mine = loaded.state_dict(), model.state_dict()
    assert sd.keys() == mine.keys() and all(torch.equal(sd[k], mine[k]) for k in sd)
    layers = [m for m in loaded.modules() if isinstance(m, Linear4bit)]
    assert len(layers) == 7 and all(m.layout == "bnb" for m in layers)  # loaders give the bnb layout
