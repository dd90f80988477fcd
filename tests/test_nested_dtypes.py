"""Double-quant statistics whose nested_dtype (bitsandbytes' ``state2.dtype``) or nested_absmax is not float32.

bitsandbytes writes such checkpoints itself: on a CPU with AVX512-BF16, ``Linear4bit``'s inference forward repacks the
weight (``_convert_weight_packed_for_cpu``) and saving it double-quantizes the absmax again in the weight's dtype
(``_convert_weight_packed_for_cpu_inverse``: ``offset = absmax.mean()``, ``quantize_blockwise(absmax - offset)``), so
``nested_dtype`` becomes "bfloat16" / "float16". The reference is bitsandbytes itself on the CPU:
``F.dequantize_4bit`` (``QuantState.from_dict`` for a checkpoint).
"""
import copy
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import fastnf4
from fastnf4 import NF4Weight
from helpers import FLOATS, bits, random_weight

F = pytest.importorskip("bitsandbytes.functional")
QuantState = F.QuantState
NAME = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
SHAPE = (96, 200)  # 300 blocks of 64: a full and a partial block of 256 nested statistics


def bnb_state(w, nested_dtype, offset_dtype=None, blocksize=64):
    """(packed, QuantState) as bitsandbytes' ``_convert_weight_packed_for_cpu_inverse`` builds them: the float32
    absmax cast to ``nested_dtype``, its mean as the offset, ``quantize_blockwise(absmax - offset, blocksize=256)``.
    With ``offset_dtype``, the offset is instead the float32 mean a little off, cast to that dtype (so that it is not a
    value of ``nested_dtype`` and the order of roundings shows)."""
    packed, plain = F.quantize_4bit(w, blocksize=blocksize, compress_statistics=False, quant_type="nf4")
    absmax = plain.absmax.to(nested_dtype)
    offset = absmax.mean()
    qabsmax, state2 = F.quantize_blockwise(absmax - offset, blocksize=256)
    assert state2.dtype == nested_dtype
    if offset_dtype is not None:
        offset = (plain.absmax.mean() * 1.0009765625 + 2 ** -13).to(offset_dtype)
    qs = QuantState(absmax=qabsmax, shape=plain.shape, code=plain.code, blocksize=blocksize, quant_type="nf4",
                    dtype=w.dtype, offset=offset, state2=state2)
    return packed, qs


def checkpoint(packed, qs, prefix="lin."):
    """The tensors bitsandbytes' Linear4bit writes for this weight."""
    sd = {f"{prefix}weight.{k}": v for k, v in qs.as_dict(packed=True).items()}
    sd[f"{prefix}weight"] = packed
    return sd


def json_of(sd, prefix="lin."):
    return bytes(sd[f"{prefix}weight.quant_state.bitsandbytes__nf4"].tolist())


def bnb_from_checkpoint(sd, prefix="lin."):
    """bitsandbytes' own reading of a checkpoint (QuantState.from_dict, as transformers does) and its dequantization."""
    key = f"{prefix}weight"
    qs = QuantState.from_dict({k[len(key) + 1:]: v for k, v in sd.items() if k.startswith(key + ".")}, torch.device("cpu"))
    return F.dequantize_4bit(sd[key], qs)


@pytest.mark.parametrize("offset_dtype", [None, *FLOATS], ids=str)
@pytest.mark.parametrize("nested_dtype", FLOATS, ids=str)
@pytest.mark.parametrize("wdtype", [torch.bfloat16, torch.float16], ids=str)
def test_from_bnb_matches_bitsandbytes(wdtype, nested_dtype, offset_dtype, rng):
    w = random_weight(SHAPE[0] * SHAPE[1], wdtype, rng).view(SHAPE)
    packed, qs = bnb_state(w, nested_dtype, offset_dtype)
    q = NF4Weight.from_bnb(packed, qs)
    assert q.nested and q.shape == SHAPE
    assert torch.equal(bits(fastnf4.dequantize(q)), bits(F.dequantize_4bit(packed, qs)))
    for out_dtype in FLOATS:  # (QuantState.dtype is the output dtype of bitsandbytes' dequantize_4bit)
        qs_out = copy.copy(qs)
        qs_out.dtype = out_dtype
        assert torch.equal(bits(fastnf4.dequantize(q, dtype=out_dtype)), bits(F.dequantize_4bit(packed, qs_out)))
    packed2, qs2 = q.to_bnb()  # the statistics as read, so bitsandbytes decodes them the same way
    assert qs2.state2.dtype == nested_dtype
    assert torch.equal(bits(F.dequantize_4bit(packed2, qs2)), bits(F.dequantize_4bit(packed, qs)))


@pytest.mark.parametrize("blocksize", [64, 128])
@pytest.mark.parametrize("nested_dtype", FLOATS, ids=str)
def test_checkpoint_matches_bitsandbytes_and_round_trips(nested_dtype, blocksize, tmp_path, rng):
    w = random_weight(SHAPE[0] * SHAPE[1], torch.bfloat16, rng).view(SHAPE)
    packed, qs = bnb_state(w, nested_dtype, blocksize=blocksize)
    save_file(checkpoint(packed, qs), str(tmp_path / "w.safetensors"))
    sd = load_file(str(tmp_path / "w.safetensors"))
    assert json.loads(json_of(sd))["nested_dtype"] == NAME[nested_dtype]
    q = NF4Weight.from_state_dict(sd, "lin.")
    assert torch.equal(bits(fastnf4.dequantize(q)), bits(bnb_from_checkpoint(sd)))
    ours = q.state_dict("lin.")  # what was read, written back unchanged: tensors, dtypes and the JSON bytes
    assert ours.keys() == sd.keys()
    for k in sd:
        assert ours[k].dtype == sd[k].dtype and torch.equal(ours[k], sd[k]), k
    assert json_of(ours) == json_of(sd)
    q2 = NF4Weight.from_state_dict(ours, "lin.")
    assert torch.equal(bits(fastnf4.dequantize(q2)), bits(fastnf4.dequantize(q)))


@pytest.mark.parametrize("nested_dtype", FLOATS, ids=str)
def test_half_precision_nested_absmax(nested_dtype, rng):
    """A nested_absmax tensor stored in bf16: widened exactly to float32, as bitsandbytes' pure-PyTorch backend does
    (``code[A] * absmax`` then ``.to(dtype)``). (Its native CPU/CUDA kernels read the tensor's bytes as float32.)"""
    from bitsandbytes.backends.default import ops as default_ops

    blockwise = getattr(default_ops._dequantize_blockwise_compute, "__wrapped__",
                        default_ops._dequantize_blockwise_compute)  # (the function, not its torch.compile wrapper)
    w = random_weight(SHAPE[0] * SHAPE[1], torch.bfloat16, rng).view(SHAPE)
    packed, qs = bnb_state(w, nested_dtype)
    sd = checkpoint(packed, qs)
    sd["lin.weight.nested_absmax"] = sd["lin.weight.nested_absmax"].to(torch.bfloat16)
    q = NF4Weight.from_state_dict(sd, "lin.")
    absmax = blockwise(qs.absmax, sd["lin.weight.nested_absmax"], qs.state2.code, 256, nested_dtype)
    absmax += torch.tensor(float(qs.offset.item()))  # QuantState.from_dict's offset, then dequantize_4bit's steps
    plain = QuantState(absmax=absmax.float(), shape=qs.shape, code=qs.code, blocksize=64, quant_type="nf4",
                       dtype=qs.dtype)
    assert torch.equal(bits(fastnf4.dequantize(q)), bits(F.dequantize_4bit(packed, plain)))
    assert q.state_dict("lin.")["lin.weight.nested_absmax"].dtype == torch.bfloat16


def test_linear_follows_dequantize_4bit_not_the_gemm_op(rng):
    """fastnf4.linear uses the weight fastnf4.dequantize gives, i.e. bitsandbytes' ``dequantize_4bit`` statistics
    (decoded into nested_dtype, offset added in that dtype). bitsandbytes' ``gemm_4bit`` op (``matmul_4bit``'s forward
    without gradients) decodes them in float32 whatever nested_dtype says; for bf16 statistics the two differ."""
    w = random_weight(SHAPE[0] * SHAPE[1], torch.bfloat16, rng).view(SHAPE)
    packed, qs = bnb_state(w, torch.bfloat16)
    q = NF4Weight.from_bnb(packed, qs)
    functional = F.dequantize_blockwise(qs.absmax, qs.state2)
    functional += qs.offset
    functional = functional.float()
    gemm_op = torch.ops.bitsandbytes.dequantize_blockwise.default(qs.absmax, qs.state2.absmax, qs.state2.code, 256,
                                                                  torch.float32) + qs.offset
    assert not torch.equal(functional, gemm_op)  # (the case tells the two apart)

    def plain(absmax):
        return NF4Weight(packed=packed, absmax=absmax, code=q.code, blocksize=64, shape=SHAPE, dtype=torch.bfloat16)

    x = torch.randn(3, SHAPE[1], generator=rng).to(torch.bfloat16)
    y = fastnf4.linear(x, q)
    assert torch.equal(bits(y), bits(fastnf4.linear(x, plain(functional))))
    assert not torch.equal(bits(y), bits(fastnf4.linear(x, plain(gemm_op))))


def test_what_bitsandbytes_linear4bit_saves_on_an_avx512_bf16_cpu(rng):
    """The real case end to end: a bnb Linear4bit run for inference on such a CPU and saved."""
    bnb = pytest.importorskip("bitsandbytes")
    if not F.has_avx512bf16():
        pytest.skip("bitsandbytes repacks (and re-quantizes in bf16) only on CPUs with AVX512-BF16")
    torch.manual_seed(0)
    layer = bnb.nn.Linear4bit(128, 64, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4",
                              compress_statistics=True)
    layer.weight = bnb.nn.Params4bit(torch.randn(64, 128, dtype=torch.bfloat16) * 0.05, requires_grad=False,
                                     quant_type="nf4", compress_statistics=True)
    layer = layer.to("cpu").eval()
    with torch.no_grad():
        layer(torch.randn(2, 128, dtype=torch.bfloat16))
    sd = {f"lin.{k}": v for k, v in layer.state_dict().items()}
    assert json.loads(json_of(sd))["nested_dtype"] == "bfloat16"
    q = NF4Weight.from_state_dict(sd, "lin.")
    assert torch.equal(bits(fastnf4.dequantize(q)), bits(bnb_from_checkpoint(sd)))
    assert json_of(q.state_dict("lin.")) == json_of(sd)


def test_decoded_weight_moves_and_keeps_its_statistics(rng):
    w = random_weight(SHAPE[0] * SHAPE[1], torch.bfloat16, rng).view(SHAPE)
    packed, qs = bnb_state(w, torch.float16)
    q = NF4Weight.from_bnb(packed, qs)
    ref = fastnf4.dequantize(q)
    q2 = q.to("cpu")
    assert torch.equal(bits(fastnf4.dequantize(q2)), bits(ref))
    assert json_of(q2.state_dict("lin.")) == json_of(checkpoint(packed, qs))
    meta = q.to("meta")
    assert fastnf4.dequantize(meta).shape == SHAPE


def test_statistics_that_do_not_match_the_decoded_absmax_are_refused(rng):
    import dataclasses

    w = random_weight(SHAPE[0] * SHAPE[1], torch.bfloat16, rng).view(SHAPE)
    q = NF4Weight.from_bnb(*bnb_state(w, torch.bfloat16))
    with pytest.raises(ValueError, match="absmax does not match"):
        dataclasses.replace(q, absmax=q.absmax * 2)
    with pytest.raises(ValueError, match="absmax does not match"):
        q.absmax = q.absmax + 1


def test_from_bnb_names_the_cpu_inference_layout(rng):
    """After an inference forward on an AVX512-BF16 CPU, a bnb Linear4bit's (weight, quant_state) are in another
    layout (bytes reordered, absmax transposed in bf16); from_bnb says so (its state_dict is the way in)."""
    w = random_weight(64 * 128, torch.bfloat16, rng).view(64, 128)  # (rows a multiple of 32, as the repacking needs)
    packed, qs = F.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
    packed_cpu, qs_cpu = F._convert_weight_packed_for_cpu(packed.clone(), copy.deepcopy(qs))
    with pytest.raises(ValueError, match="packing_format_for_cpu"):
        NF4Weight.from_bnb(packed_cpu, qs_cpu)
