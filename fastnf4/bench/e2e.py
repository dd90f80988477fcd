"""``fastnf4 bench e2e`` (first cut): decode speed of a real architecture in bf16, bitsandbytes NF4 and fastnf4
NF4, eager and captured in a CUDA graph, in one run.

The model is built from its configuration (``bench/models.json``, random weights, no hub access), cut to
``--e2e-layers`` layers when asked; fastnf4 quantizes it layer by layer on the GPU (``quantize_model``), the
bitsandbytes variant is quantized by bitsandbytes (``study/e2e.py``). Per batch size: prefill time of a
``--prompt`` token prompt (time to first token), then decode steps with transformers' ``StaticCache`` driven
by hand (one token per step, cache position in a device tensor), timed with CUDA events: eager steps, and
replays of one captured step. Peak memory per variant. Not yet here (issue 4): the full-depth 70B run in
one process, batch 32, the profiler's dequantize share and the plot.
"""
from __future__ import annotations

import statistics

import torch

from fastnf4.bench.harness import format_table, progress
from fastnf4.bench.registry import register


def _make(name: str, layers: int | None, variant: str):
    import transformers

    from fastnf4.study.e2e import bnb_model, build_config

    if variant == "bnb":
        return bnb_model(name, layers)
    cfg = build_config(name, layers)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    if variant == "fastnf4":
        from fastnf4.nn import quantize_model

        quantize_model(model)
        torch.cuda.empty_cache()
    return model.eval()


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
    cache = _cache(model, batch, prompt + 2 * steps + 16)
    ids = torch.randint(0, vocab, (batch, prompt), device="cuda")
    pre = torch.arange(prompt, device="cuda")
    ttft = _elapsed(lambda: model(input_ids=ids, past_key_values=cache, cache_position=pre, use_cache=True), 1)[0]
    tok = torch.randint(0, vocab, (batch, 1), device="cuda")
    pos = torch.tensor([prompt], device="cuda")

    def step():
        logits = model(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits
        tok.copy_(logits[:, -1:].argmax(-1))
        pos.add_(1)

    for _ in range(2):
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
    out = {"ttft_us": ttft, "step_us": statistics.median(times), "tok_per_s": batch * 1e6 / statistics.median(times)}
    if graph and top >= 0:
        # the kernel-time split of graph replays (eager steps run the same kernels); after the timing, so the
        # profiler never overlaps a timed step. A profiler session was seen to slow later eager fastnf4 steps
        # by ~20% (benchmarks/probe_eager.py), hence fastnf4 is timed first in ``run``.
        out.update(_profile(fn, 4, top))
    return out


@register("e2e")
def run(opts) -> dict:
    from fastnf4.bench.harness import bnb_version

    names = opts.models or ["qwen3-32b"]
    layers = opts.e2e_layers or None
    batches = tuple(getattr(opts, "batches", None) or (1, 8, 32))
    variants = ["fastnf4"] + (["bnb"] if bnb_version() else []) + ["bf16"]
    rows = []
    for name in names:
        for variant in progress(variants, desc=f"e2e {name}"):
            torch.cuda.reset_peak_memory_stats()
            try:
                model = _make(name, layers, variant)
            except torch.cuda.OutOfMemoryError:
                rows.append(dict(model=name, variant=variant, note="does not fit"))
                continue
            mem = torch.cuda.max_memory_allocated() / 2**30
            for batch in batches:
                for graph in (False, True):
                    row = dict(model=name, layers=model.config.num_hidden_layers, variant=variant, batch=batch,
                               mode="graph" if graph else "eager", peak_gib=mem)
                    try:
                        row.update(decode_speed(model, batch, opts.prompt, opts.steps, graph, top=8))
                    except Exception as e:  # a variant that cannot be captured is reported, not fatal
                        row["note"] = f"{type(e).__name__}: {str(e)[:120]}"
                    rows.append(row)
            del model
            torch.cuda.empty_cache()
    base = {(r["model"], r.get("batch"), r.get("mode")): r.get("tok_per_s") for r in rows if r["variant"] == "bnb"}
    for r in rows:
        b = base.get((r["model"], r.get("batch"), r.get("mode"))) or base.get((r["model"], r.get("batch"), "eager"))
        if b and r.get("tok_per_s"):
            r["vs_bnb_eager_or_same_mode"] = r["tok_per_s"] / b
    cols = [("model", "{}"), ("layers", "{}"), ("variant", "{}"), ("batch", "{}"), ("mode", "{}"), ("ttft_us", "{:.0f}"),
            ("step_us", "{:.0f}"), ("tok_per_s", "{:.1f}"), ("vs_bnb_eager_or_same_mode", "{:.2f}"),
            ("share_4bit", "{:.2f}"), ("peak_gib", "{:.1f}"), ("note", "{}")]
    return {"rows": rows, "table": format_table(rows, cols)}
