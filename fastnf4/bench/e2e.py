"""``fastnf4 bench e2e``: decode speed of a real architecture in bf16, bitsandbytes NF4, fastnf4 NF4 and the
bitsandbytes model with fastnf4's patch ("bnb+fastnf4": unmodified bitsandbytes layers, the bitsandbytes ops routed to
fastnf4 by ``integrations.bitsandbytes.patch_bitsandbytes``; rows measured under inference mode, which the patch
reaches since session 29), eager and captured in a CUDA graph, in one process, at full depth (Llama-3.3-70B
included) on one H200.

The model is built from its configuration (``bench/models.json``, random weights, no hub access), cut to
``--e2e-layers`` layers when asked, by ``study.e2e.build_model``: the skeleton is made on the ``meta`` device
and materialised module by module on the GPU, each linear quantized (fastnf4 ``Linear4bit`` or bitsandbytes
``Linear4bit``) as soon as its random bf16 weight exists, so the whole bf16 model never exists for the NF4
variants. bf16 runs only where it fits: its bytes (weights counted on the meta model, static cache and
prefill activations at the largest batch, a reserve; ``study.e2e.bf16_estimate``) are compared with the free
GPU memory before building, and a model that does not fit is one row with a "does not fit" note.

Per batch size (default 1, 8, 32): prefill time of a ``--prompt`` token prompt (time to first token), then
decode steps with transformers' ``StaticCache`` driven by hand (one token per step, cache position in a
device tensor), timed with CUDA events: eager steps, and replays of one captured step; for graph rows the
torch profiler's split of the replays' GPU time (``share_4bit``: 4-bit dequantize / matmul kernels).
Memory per variant: ``weights_gib`` (allocated after the build), ``build_peak_gib`` (peak while building and
quantizing), and per row ``decode_peak_gib`` (peak from a reset just before that row's prefill and decode:
weights + static cache + activations, + graph pool). Plot: ``benchmarks/plot_e2e.py``.
"""
from __future__ import annotations

import statistics

import torch

from fastnf4.bench.harness import format_table, progress
from fastnf4.bench.registry import register


def _make(name: str, layers: int | None, variant: str):
    from fastnf4.study.e2e import REPLACERS, build_config, build_model

    return build_model(build_config(name, layers), REPLACERS[_layers_of(variant)], "cuda", desc=f"{name} {variant}")


def _layers_of(variant: str) -> str:
    """The layers a variant's model is built with: "bnb+fastnf4" is the bitsandbytes model."""
    return "bnb" if variant == "bnb+fastnf4" else variant


def _free_memory() -> int:
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


def _cache(model, batch: int, length: int):
    from transformers import StaticCache

    try:
        return StaticCache(config=model.config, max_cache_len=length)
    except TypeError:  # transformers 4.x signature
        return StaticCache(config=model.config, max_batch_size=batch, max_cache_len=length, device="cuda",
                           dtype=torch.bfloat16)


def _elapsed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return out


def _profile(fn, n: int, top: int) -> dict:
    """Kernel-time split of ``n`` calls of ``fn`` (graph replays included: the profiler sees their kernels)."""
    from torch.profiler import ProfilerActivity, profile

    from fastnf4.study.e2e import kernel_split

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    split = kernel_split(prof, top)
    total = split["total_us"] or float("nan")
    return {"gpu_us_per_step": split["total_us"] / n,
            "share_4bit": (split["dequant_us"] + split["other_4bit_us"]) / total,
            "share_dequant": split["dequant_us"] / total,
            "top_kernels": [(k, c / n, t / n) for k, c, t in split.get("top", [])]}


@torch.inference_mode()
def decode_speed(model, batch: int, prompt: int, steps: int, graph: bool, top: int = 0) -> dict:
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (batch, prompt), device="cuda")
    pre = torch.arange(prompt, device="cuda")
    # time to first token: the median of prefills 2-4, each into a new cache (the first pays one-time costs:
    # kernel compilation, lazy module loading, allocator growth; a static cache tracks how much it holds, so
    # the same one is not refilled). One sample was too noisy: host-bound at batch 1, it moved by 10-15%.
    ttfts = []
    for _ in range(4):
        cache = _cache(model, batch, prompt + 2 * steps + 16)
        ttfts += _elapsed(lambda: model(input_ids=ids, past_key_values=cache, cache_position=pre, use_cache=True), 1)
    ttft = statistics.median(ttfts[1:])
    tok = torch.randint(0, vocab, (batch, 1), device="cuda")
    pos = torch.tensor([prompt], device="cuda")

    def step():
        logits = model(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits
        tok.copy_(logits[:, -1:].argmax(-1))
        pos.add_(1)

    for _ in range(8):  # eager steps were seen to speed up over the first few (allocator, Python caches)
        step()
    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        fn = g.replay
    else:
        fn = step
    times = _elapsed(fn, steps)
    out = {"ttft_us": ttft, "ttft_range_us": [min(ttfts[1:]), max(ttfts[1:])], "step_us": statistics.median(times),
           "step_range_us": [min(times), max(times)], "tok_per_s": batch * 1e6 / statistics.median(times)}
    if graph and top >= 0:
        # the kernel-time split of graph replays (eager steps run the same kernels); after the timing, so the profiler
        # never overlaps a timed step. A profiler session slows later eager fastnf4 steps by ~20% (commit 5761de0),
        # hence ``run`` times all eager rows first and fastnf4 first.
        out.update(_profile(fn, 4, top))
    return out


def bf16_skip_note(cfg, batch: int, prompt: int, steps: int, free: int) -> str | None:
    """``None`` when the bf16 model of ``cfg`` fits in ``free`` bytes at its largest ``batch`` by
    ``study.e2e.bf16_estimate``, else the "does not fit" note of its row."""
    from fastnf4.study.e2e import bf16_estimate

    need = bf16_estimate(cfg, batch, prompt, steps)["total"]
    if need <= free:
        return None
    return f"does not fit (estimated {need / 2**30:.1f} GiB > free {free / 2**30:.1f} GiB)"


@register("e2e")
def run(opts) -> dict:
    from fastnf4.bench.harness import bnb_version
    from fastnf4.integrations import bitsandbytes as integ
    from fastnf4.study.e2e import REPLACERS, build_config, build_model

    names = opts.models or ["qwen3-32b"]
    layers = opts.e2e_layers or None
    batches = tuple(getattr(opts, "batches", None) or (1, 8, 32))
    variants = ["fastnf4"] + (["bnb", "bnb+fastnf4"] if bnb_version() else []) + ["bf16"]
    gib = 2**30
    rows = []
    for name in names:
        cfg = build_config(name, layers)
        depth = cfg.num_hidden_layers
        kept = None  # the bitsandbytes model (and its memory figures), measured again patched as "bnb+fastnf4"
        for variant in progress(variants, desc=f"e2e {name}"):
            if variant == "bnb+fastnf4" and kept is None:
                continue  # (no bitsandbytes model was built)
            free = _free_memory()
            if variant == "bf16":  # decided from the estimate, before allocating anything
                note = bf16_skip_note(cfg, max(batches), opts.prompt, opts.steps, free)
                if note:
                    rows.append(dict(model=name, layers=depth, variant=variant, note=note))
                    continue
            torch.cuda.reset_peak_memory_stats()
            model = None
            if variant == "bnb+fastnf4":
                model, build_peak, weights = kept
                kept = None
            else:
                try:
                    model = build_model(cfg, REPLACERS[_layers_of(variant)], "cuda", desc=f"{name} {variant}")
                except torch.cuda.OutOfMemoryError:  # not expected (NF4 fits, bf16 was estimated): reported
                    pass
                if model is None:
                    rows.append(dict(model=name, layers=depth, variant=variant,
                                     note=f"out of memory while building (free before: {free / gib:.1f} GiB)"))
                    _free_memory()
                    continue
                build_peak = torch.cuda.max_memory_allocated() / gib
                _free_memory()
                weights = torch.cuda.memory_allocated() / gib
            if variant == "bnb+fastnf4":  # bitsandbytes' ops on fastnf4 kernels for this variant's rows only
                integ.patch_bitsandbytes(("cuda",))
            try:
                # every eager measurement before any graph replay is profiled: a profiler session slows later eager
                # fastnf4 steps by ~20% (commit 5761de0)
                for graph in (False, True):
                    for batch in batches:
                        row = dict(model=name, layers=depth, variant=variant, batch=batch,
                                   mode="graph" if graph else "eager", weights_gib=weights, build_peak_gib=build_peak)
                        torch.cuda.reset_peak_memory_stats()
                        try:
                            row.update(decode_speed(model, batch, opts.prompt, opts.steps, graph, top=8))
                        except Exception as e:  # a variant that cannot be captured is reported, not fatal
                            row["note"] = f"{type(e).__name__}: {str(e)[:120]}"
                        row["decode_peak_gib"] = torch.cuda.max_memory_allocated() / gib
                        rows.append(row)
            finally:
                if variant == "bnb+fastnf4":
                    integ.unpatch_bitsandbytes()
            if variant == "bnb" and "bnb+fastnf4" in variants:
                kept = (model, build_peak, weights)
            del model
            _free_memory()
    base = {(r["model"], r.get("batch"), r.get("mode")): r.get("tok_per_s") for r in rows if r["variant"] == "bnb"}
    for r in rows:
        b = base.get((r["model"], r.get("batch"), r.get("mode"))) or base.get((r["model"], r.get("batch"), "eager"))
        if b and r.get("tok_per_s"):
            r["vs_bnb_eager_or_same_mode"] = r["tok_per_s"] / b
    cols = [("model", "{}"), ("layers", "{}"), ("variant", "{}"), ("batch", "{}"), ("mode", "{}"), ("ttft_us", "{:.0f}"),
            ("step_us", "{:.0f}"), ("tok_per_s", "{:.1f}"), ("vs_bnb_eager_or_same_mode", "{:.2f}"),
            ("share_4bit", "{:.2f}"), ("weights_gib", "{:.1f}"), ("build_peak_gib", "{:.1f}"),
            ("decode_peak_gib", "{:.1f}"), ("note", "{}")]
    return {"rows": rows, "table": format_table(rows, cols)}
