"""End-to-end half of the paper study: how much of transformers ``generate()`` time goes to 4-bit
dequantization, for a bitsandbytes NF4 model, and how that changes when fastnf4 is patched in.

The model is the real architecture built from its configuration (``fastnf4/bench/models.json``; random weights,
no hub access), optionally cut to fewer layers, quantized by bitsandbytes (NF4, double quant, bf16 compute).
GPU kernel time is split with the torch profiler into dequantize kernels, other 4-bit kernels and the rest.
"""
from __future__ import annotations

import json
import os
import re
import time

import torch

DEQUANT = re.compile(r"kDequantize|dequantize_4bit", re.I)
# other 4-bit kernels: bitsandbytes' kgemm_4bit*, fastnf4's gemv_mma / gemv / gemm Triton kernels
FOUR_BIT = re.compile(r"4bit|gemv|nf4|kgemm|^gemm_kernel", re.I)


def kernel_split(prof, top: int = 0) -> dict:
    """GPU kernel time of a finished ``torch.profiler`` run, split into 4-bit dequantize kernels, other 4-bit
    kernels and the rest (microseconds); with ``top`` > 0 also the ``top`` kernels by total time."""
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


def bnb_model(name: str, layers: int | None = None):
    """The architecture with random bf16 weights on the GPU, every linear but lm_head swapped layer by layer
    for a bitsandbytes NF4 ``Linear4bit`` (quantized by bitsandbytes on the GPU)."""
    import bitsandbytes as bnb
    import transformers

    cfg = build_config(name, layers)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    for mname, module in list(model.named_modules()):
        for cname, child in list(module.named_children()):
            if type(child) is not torch.nn.Linear or cname == "lm_head":
                continue
            new = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                    compute_dtype=torch.bfloat16, compress_statistics=True, quant_type="nf4",
                                    device="cpu")
            new.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, compress_statistics=True,
                                           quant_type="nf4", blocksize=64)
            if child.bias is not None:
                new.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
            new = new.to("cuda")  # bitsandbytes quantizes here
            setattr(module, cname, new)
            del child
    torch.cuda.empty_cache()
    return model.eval()


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
