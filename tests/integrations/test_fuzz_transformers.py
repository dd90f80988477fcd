"""Fuzz of the transformers integration: random tiny decoder models of a dozen architectures, one fixed seed a case.

Each case draws an architecture and a config (hidden / head sizes, 1-3 layers, grouped or multi-query attention,
tied or untied output layer, biases where the architecture has the option, sizes that are not multiples of the
blocksize, so that blocks span rows), a dtype (bf16 / fp16), a blocksize, double quant on or off and a skip list,
then checks against references that do not go through the code under test:

1. ``quantize_model``: exactly the ``nn.Linear`` layers that are neither skipped nor tied to another module's weight
   become ``Linear4bit`` (the rest are the same objects as before, biases kept bit for bit); each layer's packed
   weight is the reference quantizer's (``ops/quantize/naive.py``, with the interpreter's IEEE reciprocal) and
   decodes to the reference dequantizer's weight (``ops/dequantize/naive.py``); each layer's output, and the
   model's logits, equal those of the same model with those reference weights: bit for bit where the layers take
   dequantize + dense matmul (M > 1 at these sizes), else as close to a float64 computation with those weights as
   the dense model in its own dtype (within 2x: the standard of test_transformers.py / test_matmul.py).
   ``load_and_quantize`` of the dense checkpoint gives the same tensors and bit-identical logits.
2. ``save_quantized`` then ``load_quantized`` (safetensors): bit-identical tensors and logits, in one file and in
   shards forced by ``max_shard_bytes``; the config lists exactly the dense linears in ``llm_int8_skip_modules``.
3. Every 4-bit layer read from the saved files by bitsandbytes (``QuantState.from_dict``) decodes bit for bit to the
   reference weight, by bitsandbytes' generic decode and, where bitsandbytes loaded its CPU library, by its public
   ``dequantize_4bit`` on the CPU.

CPU only (the Triton kernels through the interpreter); tiny sizes and a few tokens to keep the file fast.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import random

import pytest
import torch

import fastnf4
from fastnf4.codebooks import dynamic_map
from fastnf4.nn import Linear4bit, quantize_model
from fastnf4.ops.dequantize import naive as dq_ref
from fastnf4.ops.quantize import naive as q_ref
from helpers import bits, rel_err

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from fastnf4.integrations.transformers import load_and_quantize, load_quantized, save_quantized  # noqa: E402

ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "gpt_neox", "opt", "falcon", "stablelm",
         "starcoder2")
N_CASES = 12  # (one case per architecture)


@dataclasses.dataclass(frozen=True)
class Case:
    seed: int
    arch: str
    vocab: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    layers: int
    tie: bool
    bias: bool
    extra: tuple  # architecture-specific settings, (name, value) pairs
    dtype: torch.dtype
    blocksize: int
    double_quant: bool
    skip: str  # "default" (lm_head), "none" (every linear) or "one" (lm_head and one more, by full name)
    batch: int
    tokens: int

    @property
    def id(self) -> str:
        extra = "".join(f"-{k}{int(v) if isinstance(v, bool) else v}" for k, v in self.extra)
        return (f"{self.seed:02d}-{self.arch}-h{self.hidden}-hd{self.head_dim}-nh{self.heads}kv{self.kv_heads}"
                f"-i{self.inter}-L{self.layers}{'-tied' if self.tie else ''}{'-bias' if self.bias else ''}{extra}"
                f"-{str(self.dtype).removeprefix('torch.')}-bs{self.blocksize}{'-dq' if self.double_quant else ''}"
                f"-skip_{self.skip}-x{self.batch}x{self.tokens}")


def draw(seed: int) -> Case:
    """The case of ``seed`` (the architectures in turn, everything else drawn)."""
    r = random.Random(seed)
    arch = ARCHS[seed % len(ARCHS)]
    heads = r.choice((2, 4))
    head_dim = r.choice((16, 32))
    kv_heads = r.choice(sorted({1, heads // 2, heads}))
    hidden = heads * head_dim
    extra: dict = {}
    if arch in ("llama", "mistral", "qwen3", "gemma", "gemma2"):  # head_dim is a setting of its own there
        hidden = r.choice((48, 64, 80, 96, 128))
        head_dim = r.choice((8, 16, 32))
    if arch == "opt":
        kv_heads = heads  # (no grouped attention)
        extra["proj"] = r.choice((hidden, hidden // 2))  # word_embed_proj_dim: project_in / project_out if != hidden
    if arch == "gpt_neox":
        kv_heads = heads
        extra["rot"] = r.choice((0.25, 1.0))
        extra["par"] = r.random() < 0.5
    if arch == "falcon":
        # (Falcon's own layers are FalconLinear, a subclass of nn.Linear that fastnf4, like transformers' bitsandbytes
        # integration, leaves dense: only an untied lm_head, if not skipped, is nn.Linear; tied, nothing would be)
        extra["newarch"] = r.random() < 0.5
        extra["parattn"] = extra["newarch"] or r.random() < 0.5  # (the new decoder architecture is parallel)
        if not extra["newarch"]:
            kv_heads = r.choice((1, heads))  # multi_query or not
    if arch == "stablelm":
        extra["qkln"] = r.random() < 0.5
        extra["par"] = r.random() < 0.5
    if arch == "phi3":
        kv_heads = r.choice(sorted({heads // 2, heads}))
    has_bias_option = arch in ("llama", "qwen3", "gemma", "gemma2", "gpt_neox", "opt", "falcon", "stablelm",
                               "starcoder2")
    tie = r.random() < 0.5 and arch != "falcon"
    # one token (M = 1: the fused GEMV kernel, slow in the interpreter) on one layer only; M > 1 (dequantize +
    # matmul at these sizes) on 1-3
    batch, tokens = r.choice(((1, 1), (1, 3), (1, 5), (2, 1), (2, 3)))
    layers = 1 if batch * tokens == 1 else r.randint(1, 3)
    skip = r.choice(("default", "default", "none", "one")) if arch != "falcon" else "none"
    return Case(
        seed=seed, arch=arch, vocab=r.choice((64, 96, 100)), hidden=hidden, heads=heads, kv_heads=kv_heads,
        head_dim=head_dim, inter=r.choice((40, 64, 72, 96, 136)), layers=layers,
        tie=tie, bias=arch == "qwen2" or (has_bias_option and r.random() < 0.6),
        extra=tuple(sorted(extra.items())), dtype=r.choice((torch.bfloat16, torch.float16)),
        blocksize=r.choice((32, 64, 128, 256)), double_quant=r.random() < 0.7,
        skip=skip, batch=batch, tokens=tokens)


CASES = [draw(s) for s in range(N_CASES)]


def config(c: Case):
    """The transformers config of ``c``."""
    ex = dict(c.extra)
    common = dict(vocab_size=c.vocab, hidden_size=c.hidden, num_hidden_layers=c.layers, num_attention_heads=c.heads,
                  tie_word_embeddings=c.tie, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2)
    gqa = dict(intermediate_size=c.inter, num_key_value_heads=c.kv_heads)
    T = transformers
    if c.arch == "llama":
        return T.LlamaConfig(**common, **gqa, head_dim=c.head_dim, attention_bias=c.bias, mlp_bias=c.bias)
    if c.arch == "mistral":
        return T.MistralConfig(**common, **gqa, head_dim=c.head_dim)
    if c.arch == "qwen2":  # (q / k / v always have biases)
        return T.Qwen2Config(**common, **gqa)
    if c.arch == "qwen3":
        return T.Qwen3Config(**common, **gqa, head_dim=c.head_dim, attention_bias=c.bias)
    if c.arch == "gemma":
        return T.GemmaConfig(**common, **gqa, head_dim=c.head_dim, attention_bias=c.bias)
    if c.arch == "gemma2":
        return T.Gemma2Config(**common, **gqa, head_dim=c.head_dim, attention_bias=c.bias)
    if c.arch == "phi3":  # (fused qkv_proj and gate_up_proj)
        return T.Phi3Config(**common, **gqa)
    if c.arch == "gpt_neox":
        return T.GPTNeoXConfig(**common, intermediate_size=c.inter, attention_bias=c.bias, rotary_pct=ex["rot"],
                               use_parallel_residual=ex["par"])
    if c.arch == "opt":
        return T.OPTConfig(**common, ffn_dim=c.inter, enable_bias=c.bias, word_embed_proj_dim=ex["proj"])
    if c.arch == "falcon":
        return T.FalconConfig(**common, ffn_hidden_size=c.inter, bias=c.bias, new_decoder_architecture=ex["newarch"],
                              parallel_attn=ex["parattn"], num_kv_heads=c.kv_heads,
                              num_ln_in_parallel_attn=2 if ex["newarch"] else None,
                              multi_query=not ex["newarch"] and c.kv_heads == 1)
    if c.arch == "stablelm":
        return T.StableLmConfig(**common, **gqa, use_qkv_bias=c.bias, qk_layernorm=ex["qkln"],
                                use_parallel_residual=ex["par"])
    if c.arch == "starcoder2":
        return T.Starcoder2Config(**common, **gqa, use_bias=c.bias)
    raise AssertionError(c.arch)


def build(c: Case):
    torch.manual_seed(c.seed)
    # (built in the dtype, as from_pretrained does: .to(dtype) would also round the float32 rotary buffers, which
    # the loaders, building their skeleton as transformers does, keep in float32)
    model = transformers.AutoModelForCausalLM.from_config(config(c), dtype=c.dtype).eval()
    with torch.no_grad():  # (zero-initialized biases and norm weights would hide a lost or misplaced tensor)
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p.float()).to(p.dtype) * 0.05)
    return model


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def tied_linears(model) -> set[str]:
    """The nn.Linear layers whose weight tensor is also another module's (by storage), found here independently."""
    owners: dict[int, set[str]] = {}
    for mname, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            owners.setdefault(p.data_ptr(), set()).add(mname)
    return {n for n, m in model.named_modules()
            if type(m) is torch.nn.Linear and len(owners[m.weight.data_ptr()]) > 1}


def reference_weight(q: fastnf4.NF4Weight) -> torch.Tensor:
    """The dense weight of ``q`` by the pure-PyTorch reference, in ``q``'s dtype."""
    return dq_ref.dequantize(q.packed.view(torch.uint8).reshape(-1), q.absmax, q.code, q.blocksize, q.numel, q.dtype,
                             q.nested_code, q.nested_absmax, q.offset, q.nested_blocksize).view(q.shape)


def path_of(layer: Linear4bit, x: torch.Tensor) -> str:
    """The matmul path fastnf4's dispatcher takes for ``layer`` on ``x`` under the interpreter."""
    from fastnf4.ops.matmul import dispatch

    q = layer.weight_nf4
    x2d = x.reshape(-1, x.shape[-1])
    return dispatch.pick_path(x2d, q.packed, q.blocksize, *q.shape, q.nested, q.nested_blocksize, manual_bf16=True,
                              absmax=q.absmax)


def assert_same_tensors(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), (what, sorted(a.keys() ^ b.keys())[:5])
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(bits(a[k]), bits(b[k])), (what, k)


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_fuzz_transformers(c: Case, tmp_path):
    model = build(c)
    ids = torch.randint(3, c.vocab, (c.batch, c.tokens), generator=torch.Generator().manual_seed(c.seed))
    model.save_pretrained(tmp_path / "dense")
    dense = copy.deepcopy(model)
    linears = {n: m for n, m in model.named_modules() if type(m) is torch.nn.Linear}
    tied = tied_linears(model)
    if c.tie and c.arch in ("llama", "gemma"):
        assert tied, "the config asked for a tied output layer"
    out_name = next(n for n, m in linears.items() if m is model.get_output_embeddings())
    if c.skip == "default":
        skip = ("lm_head",)
        skipped = {"lm_head"} & linears.keys()
    elif c.skip == "none":
        skip, skipped = (), set()
    else:
        one = random.Random(c.seed).choice(sorted(set(linears) - {out_name}))
        skip, skipped = ("lm_head", one), {"lm_head", one} & linears.keys()
    expect = set(linears) - skipped - tied

    # 1. quantize_model: which layers, their bits, their outputs, the logits
    q = quantize_model(model, skip=skip, blocksize=c.blocksize, double_quant=c.double_quant)
    mods = dict(q.named_modules())
    assert {n for n, m in mods.items() if isinstance(m, Linear4bit)} == expect
    for n in set(linears) - expect:
        assert mods[n] is linears[n]
    assert not any(type(m) is torch.nn.Linear for n, m in mods.items() if n in expect)
    ref_model = copy.deepcopy(dense)  # the dense model with every swapped weight replaced by the reference decode
    ref_mods = dict(ref_model.named_modules())
    for n in sorted(expect):
        layer, orig = mods[n], linears[n]
        qw = layer.weight_nf4
        assert (qw.blocksize, qw.nested, qw.dtype, tuple(qw.shape)) == \
            (c.blocksize, c.double_quant, c.dtype, tuple(orig.weight.shape)), n
        want_p, want_a = q_ref.quantize_4bit(orig.weight.detach().reshape(-1), c.blocksize, "nf4",
                                             reciprocal=q_ref.ieee_reciprocal_ftz)
        assert torch.equal(qw.packed.view(torch.uint8).reshape(-1), want_p), n
        if not c.double_quant:
            assert torch.equal(bits(qw.absmax), bits(want_a)), n
        else:  # the absmax quantized again, 8 bits in blocks of 256 around their mean
            offset = want_a.mean()
            want_q, want_a2 = q_ref.quantize_8bit(want_a, offset, dynamic_map(), 256,
                                                  reciprocal=q_ref.ieee_reciprocal_ftz)
            assert torch.equal(qw.absmax, want_q) and torch.equal(bits(qw.nested_absmax), bits(want_a2)), n
            assert torch.equal(bits(qw.offset.reshape(1)), bits(offset.reshape(1))), n
        wd = reference_weight(qw)
        if c.batch * c.tokens == 1:  # (at M > 1 the layers' outputs below check fastnf4's decode bit for bit)
            assert torch.equal(bits(fastnf4.dequantize(qw)), bits(wd)), n
        if orig.bias is None:
            assert layer.bias is None, n
        else:
            assert torch.equal(bits(layer.bias), bits(orig.bias)), n
        with torch.no_grad():
            ref_mods[n].weight.copy_(wd)
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # layer: (input, output)
    hooks = [m.register_forward_hook(lambda mod, args, out, n=n: seen.__setitem__(n, (args[0], out)))
             for n, m in mods.items() if n in expect]
    got = logits(q, ids)
    for h in hooks:
        h.remove()
    assert seen.keys() == expect
    fused = set()  # the layers whose matmul ran in a fused kernel (not dequantize + the dense matmul)
    for n, (x, y) in sorted(seen.items()):  # each layer: x @ W.T + b, W the reference decode
        wd, b = ref_mods[n].weight, ref_mods[n].bias
        dense_y = torch.nn.functional.linear(x, wd, b)
        assert y.dtype == c.dtype, n
        if path_of(mods[n], x) == "dequant+matmul":  # the same math: the same bits
            assert torch.equal(bits(y), bits(dense_y)), n
            continue
        fused.add(n)
        exact = x.double() @ wd.double().T + (0 if b is None else b.double())
        yardstick = rel_err(dense_y, exact)
        assert rel_err(y, exact) <= 2 * yardstick + 2.0 ** -20, (n, rel_err(y, exact), yardstick)
    want = logits(ref_model, ids)
    if not fused:
        assert torch.equal(bits(got), bits(want))
    else:
        exact = logits(copy.deepcopy(ref_model).double(), ids)
        yardstick = rel_err(want, exact)
        assert got.dtype == c.dtype and rel_err(got, exact) <= 2 * yardstick + 2.0 ** -20, \
            (rel_err(got, exact), yardstick)

    # ... and load_and_quantize of the dense checkpoint: the same tensors, the same logits
    lq = load_and_quantize(str(tmp_path / "dense"), device="cpu", dtype=c.dtype, skip=skip, blocksize=c.blocksize,
                           double_quant=c.double_quant)
    assert {n for n, m in lq.named_modules() if isinstance(m, Linear4bit)} == expect
    assert_same_tensors(lq.state_dict(), q.state_dict(), "load_and_quantize")
    if tied:
        assert lq.get_output_embeddings().weight is lq.get_input_embeddings().weight
    assert torch.equal(bits(logits(lq, ids)), bits(got))

    # 2. save_quantized / load_quantized, in one file and in shards
    total = sum(t.numel() * t.element_size() for t in q.state_dict().values())
    for sub, max_shard in (("one", None), ("shards", max(total // 5, 1))):
        path = tmp_path / sub
        save_quantized(q, str(path), max_shard_bytes=max_shard)
        files = sorted(os.listdir(path))
        if max_shard is None:
            assert "model.safetensors" in files and "model.safetensors.index.json" not in files
        else:
            assert "model.safetensors" not in files and sum(f.startswith("model-") for f in files) > 2, files
        with open(path / "config.json") as f:
            qc = json.load(f)["quantization_config"]
        assert (qc["bnb_4bit_quant_type"], qc["bnb_4bit_use_double_quant"], qc["load_in_4bit"]) == \
            ("nf4", c.double_quant, True)
        assert qc["llm_int8_skip_modules"] == sorted(set(linears) - expect)
        back = load_quantized(str(path), device="cpu", dtype=c.dtype)
        assert {n for n, m in back.named_modules() if isinstance(m, Linear4bit)} == expect
        assert_same_tensors(back.state_dict(), q.state_dict(), f"load_quantized ({sub})")
        if tied:
            assert back.get_output_embeddings().weight is back.get_input_embeddings().weight
        assert torch.equal(bits(logits(back, ids)), bits(got)), sub

    # 3. bitsandbytes reads each saved 4-bit layer back to the reference weight
    F = pytest.importorskip("bitsandbytes.functional")
    from bitsandbytes.cextension import lib
    from safetensors.torch import load_file
    # bitsandbytes' public CPU decode runs its native library's CPU kernel. With the CPU build of that library (what a
    # CPU-only machine loads) it gives the reference bits; the CUDA build's copy of that kernel (loaded wherever a GPU
    # is) does not: on an H100 machine (0.50.2, db1da94) it decoded 14 of the 8192 fp16 values of a [128, 64]
    # weight, all in the last 256-block, one ulp off its own generic decode and its CUDA kernel (three fp16 cases of
    # this test). There the public decode is not the oracle; bitsandbytes' generic decode (the same product in float32,
    # one cast, as its CUDA kernel) is checked everywhere. Its CUDA decode is checked on the GPU
    # (tests/gpu/integrations/test_checkpoints_gpu.py).
    public_exact = "cuda" not in os.path.basename(str(getattr(lib, "_name", "")))
    try:
        from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
        from bitsandbytes.backends.utils import _get_4bit_code
    except ImportError:  # (bitsandbytes before 0.48's backend layout)
        _dequantize_4bit_compute = None

    saved: dict[str, torch.Tensor] = {}
    for f in sorted(os.listdir(tmp_path / "shards")):
        if f.endswith(".safetensors"):
            saved.update(load_file(str(tmp_path / "shards" / f)))
    for n in sorted(expect):
        key = f"{n}.weight"
        stats = {k[len(key) + 1:]: v for k, v in saved.items() if k.startswith(key + ".")}
        state = F.QuantState.from_dict(stats, "cpu")
        shape = tuple(state.shape)
        if shape[-1] % c.blocksize:
            # bitsandbytes' native CPU kernel (0.50.2) decodes a 2-D weight whose rows are not a whole number of
            # blocks wrongly: its blocks do not run on across rows, unlike those of its own CPU quantize_4bit and
            # of its CUDA kernels (its own CPU round trip of a [64, 32] weight at blocksize 128 is 4x worse than
            # its generic decode). The same bytes and statistics decoded as one flat row take its flat layout.
            state.shape = torch.Size([math.prod(shape)])
        theirs = F.dequantize_4bit(saved[key], state).view(shape)
        assert theirs.dtype == c.dtype and theirs.shape == ref_mods[n].weight.shape, n
        if public_exact:
            assert torch.equal(bits(theirs), bits(ref_mods[n].weight)), n
        if _dequantize_4bit_compute is not None:
            absmax = F.dequantize_blockwise(state.absmax, state.state2) + state.offset if state.nested else state.absmax
            generic = _dequantize_4bit_compute(saved[key].view(torch.uint8).reshape(-1), absmax.float(),
                                               _get_4bit_code("nf4", "cpu"), c.blocksize, shape, c.dtype)
            assert torch.equal(bits(generic), bits(ref_mods[n].weight)), n


def test_gpt_neox_checkpoint_keys_renamed_as_transformers_does(tmp_path):
    """transformers 5 names GPT-NeoX's output layer ``lm_head`` but reads and writes it in checkpoints as
    ``embed_out.*`` (Pythia's layout; a key renaming of its own): the loaders rename keys as transformers does. Before,
    load_and_quantize skipped ``embed_out.weight`` as unknown and failed ("did not provide ['lm_head.weight']"), and
    load_quantized did the same with a bnb-4bit checkpoint that keeps the key (as transformers + bitsandbytes save it)."""
    from safetensors.torch import load_file, save_file

    cfg = transformers.GPTNeoXConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=4, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                     max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    model.save_pretrained(tmp_path / "dense")
    assert "embed_out.weight" in load_file(str(tmp_path / "dense" / "model.safetensors"))
    ids = torch.randint(3, 64, (1, 4), generator=torch.Generator().manual_seed(0))
    q = load_and_quantize(str(tmp_path / "dense"), device="cpu", skip=())
    assert isinstance(q.lm_head, Linear4bit)
    want = quantize_model(model, skip=())
    assert_same_tensors(q.state_dict(), want.state_dict(), "load_and_quantize")
    save_quantized(q, str(tmp_path / "nf4"))
    sd = load_file(str(tmp_path / "nf4" / "model.safetensors"))
    legacy = {("embed_out." + k[len("lm_head."):] if k.startswith("lm_head.") else k): v for k, v in sd.items()}
    assert "embed_out.weight.absmax" in legacy
    save_file(legacy, str(tmp_path / "nf4" / "model.safetensors"), metadata={"format": "pt"})
    back = load_quantized(str(tmp_path / "nf4"), device="cpu")
    assert_same_tensors(back.state_dict(), q.state_dict(), "load_quantized")
    assert torch.equal(bits(logits(back, ids)), bits(logits(q, ids)))
