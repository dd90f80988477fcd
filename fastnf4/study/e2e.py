"""End-to-end half of the paper study: how much of transformers ``generate()`` time goes to 4-bit
dequantization, for a bitsandbytes NF4 model, and how that changes when fastnf4 is patched in.

The model is the real architecture built from its configuration (``fastnf4/bench/models.json``; random weights,
no hub access), optionally cut to fewer layers, quantized by bitsandbytes (NF4, double quant, bf16 compute).
``build_model`` (shared with ``bench e2e``) makes the skeleton on the ``meta`` device and materialises it module
by module, quantizing each linear as soon as its random bf16 weight exists (fastnf4 or bitsandbytes), so a
70B model never needs its 141 GB of bf16 weights at once; ``bf16_estimate`` says what the bf16 model needs.
GPU kernel time is split with the torch profiler into dequantize kernels, other 4-bit kernels and the rest.
"""
from __future__ import annotations

import json
import os
import re
import time

import torch

DEQUANT = re.compile(r"kDequantize|dequantize_4bit", re.I)
# other 4-bit kernels: bitsandbytes' gemm_4bit_simt / gemm_4bit_sm80_* / kgemm_4bit_inference*, fastnf4's
# fastnf4_mma::gemv_* / fastnf4_wg::nf4_wgmma / splitk_sum CUDA kernels, gemv / gemm Triton kernels and the split-K
# sum of the Triton path (add_parts_kernel). Under torch.compile the same kernels run (fastnf4::linear and
# bitsandbytes' ops stay opaque custom-op calls in inductor's graph); inductor's own kernels (triton_poi_fused_*,
# triton_red_fused_*, triton_per_fused_*, named after the aten ops they fuse) and cuBLAS' (nvjet_*) match neither
# pattern (tests/bench/test_bench_e2e.py). bitsandbytes' dequantize + bf16 matmul path (batch > 1) counts its
# dequantize kernels only: the cuBLAS matmul over the dequantized weight is in the rest.
FOUR_BIT = re.compile(r"4bit|gemv|nf4|kgemm|^gemm_kernel|^add_parts_kernel", re.I)


def busy_us(spans) -> float:
    """The length of the union of ``(start, end)`` intervals: the time during which at least one of them ran."""
    total, reached = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reached:
            total += end - max(start, reached)
            reached = end
    return total


def kernel_split(prof, top: int = 0) -> dict:
    """GPU kernel time of a finished ``torch.profiler`` run, split into 4-bit dequantize kernels, other 4-bit
    kernels and the rest (microseconds, sums of the kernels' times); where the profile has the kernels' intervals
    also ``busy_us`` and ``four_bit_busy_us``, the time during which any kernel / any 4-bit kernel ran (overlaps
    counted once); with ``top`` > 0 also the ``top`` kernels by total time."""
    dq = fb = total = 0.0
    names = []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
        if ev.device_type is not None and str(ev.device_type).endswith("CUDA") and t:
            total += t
            names.append((t, ev.count, ev.key))
            if DEQUANT.search(ev.key):
                dq += t
            elif FOUR_BIT.search(ev.key):
                fb += t
    out = {"total_us": total, "dequant_us": dq, "other_4bit_us": fb}
    # Busy time: the union of the kernels' intervals, so that kernels running at the same time count once. They do:
    # the wgmma path's split-K sum is launched as a programmatic dependent of its matmul and sits on the GPU waiting
    # for it, so its recorded time includes the matmul's (bench e2e at batch 8: the sums exceeded the step).
    spans, four_bit_spans = [], []
    for ev in prof.events() if hasattr(prof, "events") else ():
        r = getattr(ev, "time_range", None)
        if str(ev.device_type).endswith("CUDA") and r is not None and r.end > r.start:
            spans.append((r.start, r.end))
            if DEQUANT.search(ev.name) or FOUR_BIT.search(ev.name):
                four_bit_spans.append((r.start, r.end))
    if spans:
        out["busy_us"] = busy_us(spans)
        out["four_bit_busy_us"] = busy_us(four_bit_spans)
    if top:
        out["top"] = [(k[:80], c, t) for t, c, k in sorted(names, reverse=True)[:top]]
    return out


def build_config(name: str, layers: int | None = None):
    import transformers

    with open(os.path.join(os.path.dirname(__file__), "..", "bench", "models.json")) as f:
        spec = json.load(f)[name]
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "vocab_size", "rope_theta", "rms_norm_eps", "tie_word_embeddings")
    kw = {k: spec[k] for k in keys if k in spec}
    if layers:
        kw["num_hidden_layers"] = layers
    cfg = transformers.AutoConfig.for_model(spec["model_type"], **kw)
    return cfg


def meta_model(cfg):
    """The architecture of ``cfg`` in bf16 on the ``meta`` device: shapes only, no memory."""
    import transformers

    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)


def param_bytes(model) -> int:
    """Bytes of the parameters of ``model`` (tied parameters counted once); works on a meta model."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


BF16_RESERVE = 2**30  # bf16_estimate's fixed reserve (bytes)


def bf16_estimate(cfg, batch: int, prompt: int, steps: int) -> dict:
    """Bytes the bf16 model of ``cfg`` needs in ``bench e2e`` at ``batch`` (its largest batch): the weights
    (counted on the meta model), the static cache of ``prompt + 2 steps + 16`` positions on every layer
    (as ``bench.e2e.decode_speed`` allocates it), prefill activations of ``batch x prompt`` tokens (two copies
    of the logits, the MLP's three intermediate tensors, a few hidden-size tensors) and a fixed reserve for
    cuBLAS workspaces, graph pools and allocator rounding. An estimate, deliberately on the high side."""
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    tokens = batch * prompt
    out = {"weights": param_bytes(meta_model(cfg)),
           "cache": 2 * text.num_hidden_layers * batch * kv * head_dim * (prompt + 2 * steps + 16) * 2,
           "activations": tokens * 2 * (2 * text.vocab_size + 3 * text.intermediate_size + 6 * text.hidden_size),
           "reserve": BF16_RESERVE}
    out["total"] = sum(out.values())
    return out


def fastnf4_linear(layer: torch.nn.Linear) -> torch.nn.Module:
    """``build_model`` replacer: a fastnf4 NF4 ``Linear4bit`` (blocksize 64, double quant), quantized where
    ``layer`` lies."""
    from fastnf4.nn import Linear4bit

    return Linear4bit.from_linear(layer)


def bnb_linear(layer: torch.nn.Linear) -> torch.nn.Module:
    """``build_model`` replacer: a bitsandbytes NF4 ``Linear4bit`` (blocksize 64, double quant, bf16 compute),
    quantized by bitsandbytes on ``layer``'s device."""
    import bitsandbytes as bnb

    device = layer.weight.device
    new = bnb.nn.Linear4bit(layer.in_features, layer.out_features, bias=layer.bias is not None,
                            compute_dtype=torch.bfloat16, compress_statistics=True, quant_type="nf4", device="meta")
    new.weight = bnb.nn.Params4bit(layer.weight.data, requires_grad=False, compress_statistics=True,
                                   quant_type="nf4", blocksize=64)
    if layer.bias is not None:
        new.bias = torch.nn.Parameter(layer.bias.data, requires_grad=False)
    return new.to(device)  # bitsandbytes quantizes here


REPLACERS = {"bf16": None, "fastnf4": fastnf4_linear, "bnb": bnb_linear}


def _materialize(model, module, device, std: float, shared: dict) -> None:
    """Give ``module``'s own meta parameters and buffers real storage on ``device`` and initialise them with
    the model's ``_init_weights`` (rotary ``inv_freq`` recomputed, norms ones or zeros as the architecture
    wants, embedding scale, ...); before that, parameters get N(0, std) and buffers zeros, so nothing is left
    uninitialised. A tensor that several modules share (tied embeddings) is created once."""
    fresh = False
    with torch.no_grad():
        for table in (module._parameters, module._buffers):
            for key, t in list(table.items()):
                if t is None or not t.is_meta:
                    continue
                if id(t) in shared and shared[id(t)][1] is not None:
                    table[key] = shared[id(t)][1]
                    continue
                real = torch.empty_like(t, device=device)
                if table is module._parameters:
                    real = torch.nn.Parameter(real.normal_(0.0, std) if real.is_floating_point() else real.zero_(),
                                              requires_grad=t.requires_grad)
                else:
                    real.zero_()
                table[key] = real
                fresh = True
                if id(t) in shared:
                    shared[id(t)] = (t, real)
    if fresh:
        model._init_weights(module)


def build_model(cfg, replace=None, device="cuda", desc: str = ""):
    """The architecture of ``cfg`` with random bf16 weights on ``device``, built without ever holding the
    whole bf16 model: the skeleton is made on the ``meta`` device, then materialised module by module in
    order; each ``nn.Linear`` (except ``lm_head``, ``fastnf4.nn.DEFAULT_SKIP``) is passed, as soon as its
    weight exists, to ``replace`` (``fastnf4_linear``, ``bnb_linear``; ``None`` keeps bf16), and the bf16
    weight is dropped. At most one bf16 linear is alive at a time besides what was already built."""
    from fastnf4.bench.harness import progress
    from fastnf4.nn import DEFAULT_SKIP, _matches

    model = meta_model(cfg)
    device = torch.device(device)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    std = getattr(text, "initializer_range", None) or 0.02
    owners: dict[int, list] = {}
    for _, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        owners.setdefault(id(t), []).append(t)
    shared = {i: (ts[0], None) for i, ts in owners.items() if len(ts) > 1}
    del owners

    def visit(module, prefix):
        _materialize(model, module, device, std, shared)
        names = [n for n, c in module._modules.items() if c is not None]
        if isinstance(module, torch.nn.ModuleList) and len(names) > 1:
            names = progress(names, desc=f"{desc} build {prefix.rstrip('.')}".strip())
        for cname in names:
            child = module._modules[cname]
            visit(child, f"{prefix}{cname}.")
            full = f"{prefix}{cname}"
            if replace is not None and type(child) is torch.nn.Linear and not _matches(full, DEFAULT_SKIP):
                module._modules[cname] = replace(child)
            del child

    visit(model, "")
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError(f"build_model left tensors on meta: {left[:5]}")
    return model.eval()


def bnb_model(name: str, layers: int | None = None, device="cuda"):
    """The architecture with random weights on the GPU, every linear but lm_head a bitsandbytes NF4
    ``Linear4bit`` (quantized by bitsandbytes as it is built, see ``build_model``)."""
    return build_model(build_config(name, layers), bnb_linear, device)


def profile_generate(model, batch: int, prompt: int, new_tokens: int) -> dict:
    """Wall time of one ``generate`` and the split of its GPU kernel time."""
    from torch.profiler import ProfilerActivity, profile

    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device="cuda")
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, **kw)  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, **kw)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            model.generate(ids, **kw)
            torch.cuda.synchronize()
    split = kernel_split(prof)
    dq, fb, total = split["dequant_us"], split["other_4bit_us"], split["total_us"]
    return {"batch": batch, "wall_s": wall, "gpu_kernel_s": total / 1e6, "dequant_s": dq / 1e6,
            "other_4bit_s": fb / 1e6, "dequant_share_of_gpu": dq / total if total else 0.0,
            "dequant_share_of_wall": dq / 1e6 / wall if wall else 0.0}


def dequant_share(name: str = "qwen3-32b", layers: int | None = None, batches=(1, 8, 32), prompt: int = 128,
                  new_tokens: int = 32) -> dict:
    """Rows per batch for bitsandbytes as installed and with fastnf4 patched in (same model, same run)."""
    from fastnf4.integrations import bitsandbytes as integ

    model = bnb_model(name, layers)
    rows = []
    for patched in (False, True):
        if patched:
            integ.patch_bitsandbytes(("cuda",))
        else:
            integ.unpatch_bitsandbytes()
        for b in batches:
            rows.append({"provider": "bnb+fastnf4" if patched else "bnb", **profile_generate(model, b, prompt, new_tokens)})
    integ.unpatch_bitsandbytes()
    return {"model": name, "layers": model.config.num_hidden_layers, "prompt": prompt, "new_tokens": new_tokens,
            "rows": rows}
