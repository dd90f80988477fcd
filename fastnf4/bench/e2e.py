"""``fastnf4 bench e2e``: decode speed of a real architecture in bf16, bitsandbytes NF4, fastnf4 NF4 and the
bitsandbytes model with fastnf4's patch ("bnb+fastnf4": unmodified bitsandbytes layers, the bitsandbytes ops routed to
fastnf4 by ``integrations.bitsandbytes.patch_bitsandbytes``; the rows are measured under ``torch.inference_mode()``,
where the patch applies too: benchmarks/results/h200-probe-patch-inference.json), in one process, at full depth
(Llama-3.3-70B included) on one H200.

The model is built from its configuration (``bench/models.json``, random weights, no hub access), cut to
``--e2e-layers`` layers when asked, by ``study.e2e.build_model``: the skeleton is made on the ``meta`` device
and materialised module by module on the GPU, each linear quantized (fastnf4 ``Linear4bit`` or bitsandbytes
``Linear4bit``) as soon as its random bf16 weight exists, so the whole bf16 model never exists for the NF4
variants. bf16 runs only where it fits: its bytes (weights counted on the meta model, static cache and
prefill activations at the largest batch, a reserve; ``study.e2e.bf16_estimate``) are compared with the free
GPU memory before building, and a model that does not fit is one row with a "does not fit" note.

Per batch size (default 1, 8, 32): prefill time of a ``--prompt`` token prompt (time to first token), then
decode steps with transformers' ``StaticCache`` driven by hand (one token per step, cache position in a
device tensor), timed with CUDA events, in the modes of ``--e2e-modes`` (default ``eager graph``):

* ``eager``: eager steps.
* ``graph``: replays of one eager step captured in a CUDA graph.
* ``compiled``: ``torch.compile`` of the model's forward (inductor, default mode: no inductor CUDA graphs;
  ``fullgraph=True``, or ``fullgraph=False`` where Dynamo cannot trace the forward in one graph, which the row's
  ``fullgraph`` and note say; ``dynamic=False``: one compile per batch size, ``compile_s``), one compiled step
  captured in a CUDA graph by hand as in ``graph`` mode, replays timed. Its ``ttft_us`` is the eager prefill
  (``prefill: "eager"`` in the row), as transformers' ``generate`` runs it when it compiles the decode step: a
  compiled prefill would be one more compile per batch size (about 2 minutes at full depth on the H200).
  Dynamo's caches are reset before each variant (``torch._dynamo.reset``). Not in the default modes: a full-depth
  compile takes about 2 minutes per batch size and variant.

With ``--e2e-generate``, each compiled row also gets the figures of the same model decoded by transformers'
``generate()`` as its documentation recommends for speed (``cache_implementation="static"``; transformers compiles
the decode step itself: ``torch.compile`` of the model's call, inductor, mode "reduce-overhead", i.e. inductor's own
CUDA graphs; the prefill stays eager): ``generate_tok_per_s`` (decode tokens/s: ``batch * (steps - 1)`` over the
median time of 3 greedy ``generate`` calls of ``--steps`` new tokens less the median time of 3 calls of one new
token, after one call that compiles, which is ``generate_compile_s``) and ``generate_vs_step`` (that over the row's
``tok_per_s``: the share of the graph-replay speed left after generate's own per-token work on the host). It is
what a user of ``generate()`` gets, and what ``tools/hf_generate_check.py`` compares a checkpoint loaded with
``from_pretrained`` against. One more compile per batch size (about 2 minutes at full depth on the H200).

For graph and compiled rows, the torch profiler's split of the replays' GPU time: ``share_4bit`` (4-bit dequantize /
matmul kernels, ``study.e2e.kernel_split``), ``four_bit_us`` (their GPU time per step: the time during which any of
them ran, kernels that overlap counted once; ``four_bit_sum_us`` adds their times) against ``floor_4bit_us``, the
NF4 byte floor of the model's quantized linears at that batch (``nf4_floor_bytes`` at the copy bandwidth measured
at the start of the run, ``copy`` in the JSON), and the ratio ``four_bit_vs_floor``.
Memory per variant: ``weights_gib`` (allocated after the build), ``build_peak_gib`` (peak while building and
quantizing), and per row ``decode_peak_gib`` (peak from a reset just before that row's prefill and decode:
weights + static cache + activations, + graph pool). Plot: ``tools/plot_e2e.py``.
"""
from __future__ import annotations

import math
import statistics
import time

import torch

from fastnf4.bench.harness import format_table, progress
from fastnf4.bench.registry import register

MODES = ("eager", "graph", "compiled")  # (measured in this order: see ``run``)
DEFAULT_MODES = ("eager", "graph")
VARIANTS = ("fastnf4", "bnb", "bnb+fastnf4", "bf16")  # (built in this order)
BNB_VARIANTS = ("bnb", "bnb+fastnf4")


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


def plan(opts, bnb_available: bool) -> dict:
    """What ``run`` measures, from the parsed options: ``models``, ``layers`` (None: full depth), ``batches``,
    ``modes`` (in ``MODES`` order whatever order they were given in), ``variants`` (in ``VARIANTS`` order; the
    bitsandbytes ones dropped where bitsandbytes cannot be imported, ``skipped`` says which). Unknown modes or
    variants, and ``e2e_generate`` without the compiled mode, raise a ValueError."""
    modes = list(getattr(opts, "e2e_modes", None) or DEFAULT_MODES)
    variants = list(getattr(opts, "e2e_variants", None) or VARIANTS)
    for what, given, known in (("mode", modes, MODES), ("variant", variants, VARIANTS)):
        bad = [g for g in given if g not in known]
        if bad:
            raise ValueError(f"unknown e2e {what}(s) {bad}: choose from {list(known)}")
    if getattr(opts, "e2e_generate", False) and "compiled" not in modes:
        raise ValueError("--e2e-generate times generate() beside the compiled rows: add 'compiled' to --e2e-modes")
    skipped = [v for v in VARIANTS if v in variants and v in BNB_VARIANTS and not bnb_available]
    batches = list(dict.fromkeys(getattr(opts, "batches", None) or (1, 8, 32)))
    if any(b < 1 for b in batches):
        raise ValueError(f"batch sizes must be >= 1, got {batches}")
    return {"models": list(getattr(opts, "models", None) or ["qwen3-32b"]),
            "layers": getattr(opts, "e2e_layers", 0) or None, "batches": batches,
            "modes": [m for m in MODES if m in modes],
            "variants": [v for v in VARIANTS if v in variants and v not in skipped], "skipped": skipped}


# ---------------------------------------------------------------------------------------------- the NF4 byte floor


def quantized_shapes(model) -> list[tuple[int, int]]:
    """(N, K) of every 4-bit linear of ``model``: fastnf4's and bitsandbytes' ``Linear4bit`` (both are built by
    ``study.e2e`` as NF4, blocksize 64, double quantization)."""
    return [(m.out_features, m.in_features) for m in model.modules() if type(m).__name__ == "Linear4bit"]


def nf4_floor_bytes(shapes, batch: int, blocksize: int = 64, nested: bool = True, nested_blocksize: int = 256,
                    act_bytes: int = 2) -> int:
    """Bytes one decode step's 4-bit linears must move at least: per (N, K) in ``shapes``, the packed weight
    (N K / 2), its statistics (one absmax per ``blocksize`` values: a uint8 code with double quantization plus one
    float32 per ``nested_blocksize`` of them, else a float32) and the activations read and written
    (``batch`` x (K + N) x ``act_bytes``). The 16- and 256-entry code tables and the offset (a few hundred bytes per
    layer, read from cache) are left out."""
    total = 0
    for n, k in shapes:
        blocks = math.ceil(n * k / blocksize)
        stats = blocks + 4 * math.ceil(blocks / nested_blocksize) if nested else 4 * blocks
        total += math.ceil(n * k / 2) + stats + batch * (k + n) * act_bytes
    return total


def floor_us(nbytes: int, copy_gbps: float | None) -> float | None:
    """Microseconds to move ``nbytes`` at ``copy_gbps`` (harness.copy_bandwidth's GB/s, bytes read + written)."""
    if not copy_gbps or not nbytes:
        return None
    return nbytes / (copy_gbps * 1e3)


def add_floor(row: dict, shapes, copy_gbps: float | None) -> dict:
    """``floor_4bit_us`` (the NF4 byte floor of ``shapes`` at the row's batch) and, where the row has the 4-bit
    kernels' GPU time per step (``four_bit_us``), their ratio ``four_bit_vs_floor``. Rows without a batch or
    without 4-bit linears (bf16) are returned unchanged."""
    if not shapes or not row.get("batch"):
        return row
    floor = floor_us(nf4_floor_bytes(shapes, row["batch"]), copy_gbps)
    if floor is None:
        return row
    row["floor_4bit_us"] = floor
    if row.get("four_bit_us"):
        row["four_bit_vs_floor"] = row["four_bit_us"] / floor
    return row


# ---------------------------------------------------------------------------------------------- decoding


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
    return split_row(split, n)


def split_row(split: dict, n: int) -> dict:
    """The row's columns from ``study.e2e.kernel_split``'s result over ``n`` steps. ``gpu_us_per_step`` and
    ``four_bit_us`` are busy times (kernels that overlap counted once) where the profile gave the kernels'
    intervals, else sums; ``four_bit_sum_us`` is always the sum of the 4-bit kernels' times."""
    total = split["total_us"] or float("nan")
    four_bit = split["dequant_us"] + split["other_4bit_us"]
    row = {"gpu_us_per_step": split["total_us"] / n, "share_4bit": four_bit / total,
           "share_dequant": split["dequant_us"] / total, "four_bit_us": four_bit / n, "four_bit_sum_us": four_bit / n,
           "top_kernels": [(k, c / n, t / n) for k, c, t in split.get("top", [])]}
    if split.get("busy_us"):
        row.update(gpu_us_per_step=split["busy_us"] / n, four_bit_us=split["four_bit_busy_us"] / n,
                   share_4bit=split["four_bit_busy_us"] / split["busy_us"])
    return row


class CompiledForward:
    """``torch.compile(model.forward, fullgraph=True, dynamic=False)`` (inductor, default mode: no inductor CUDA
    graphs, so that the step can be captured by hand). Where Dynamo cannot trace the forward as one graph (the first
    call raises ``torch._dynamo.exc.Unsupported``; nothing has run then), Dynamo is reset and the forward compiled
    again with ``fullgraph=False``: ``fullgraph`` and ``fallback`` say so. ``dynamic=False``: each new input shape
    (batch size) is one more compile, never a dynamic-shape graph."""

    def __init__(self, model, compile_fn=None):
        self.model = model
        self.compile_fn = compile_fn or torch.compile
        self.fullgraph = True
        self.fallback: str | None = None
        self.fn = self.compile_fn(model.forward, fullgraph=True, dynamic=False)

    def __call__(self, *args, **kwargs):
        if not self.fullgraph:
            return self.fn(*args, **kwargs)
        try:
            return self.fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - only Dynamo's "cannot trace this" is retried, the rest re-raised
            if not _is_unsupported(e):
                raise
            torch._dynamo.reset()
            self.fullgraph = False
            self.fallback = f"fullgraph=False ({type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''})"
            self.fn = self.compile_fn(self.model.forward, fullgraph=False, dynamic=False)
            return self.fn(*args, **kwargs)


def _is_unsupported(e: BaseException) -> bool:
    try:
        from torch._dynamo.exc import Unsupported
    except ImportError:  # pragma: no cover - torch without Dynamo
        return False
    return isinstance(e, Unsupported)


def _capture(step):
    """One call of ``step`` on a side stream (lazy loading, cuBLAS handles), then a CUDA graph of one call."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    return g


@torch.inference_mode()
def decode_speed(model, batch: int, prompt: int, steps: int, mode="eager", top: int = 0, forward=None) -> dict:
    """One row's timings. ``mode``: "eager", "graph" or "compiled" (True / False are taken for "graph" / "eager").
    ``forward``: what a decode step calls for "compiled" (a ``CompiledForward`` of ``model``; made here if None).
    The prefill (TTFT) is eager in every mode."""
    mode = {True: "graph", False: "eager"}.get(mode, mode) if isinstance(mode, bool) else mode
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "compiled" and forward is None:
        forward = CompiledForward(model)
    call = forward if mode == "compiled" else model
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
        logits = call(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits
        tok.copy_(logits[:, -1:].argmax(-1))
        pos.add_(1)

    out = {}
    if mode == "compiled":  # the first step compiles (for this batch size); timed on its own
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        out.update(compile_s=time.perf_counter() - t0, fullgraph=forward.fullgraph, prefill="eager")
        if forward.fallback:
            out["note"] = forward.fallback
    for _ in range(8):  # eager steps were seen to speed up over the first few (allocator, Python caches)
        step()
    fn = _capture(step).replay if mode in ("graph", "compiled") else step
    times = _elapsed(fn, steps)
    out.update({"ttft_us": ttft, "ttft_range_us": [min(ttfts[1:]), max(ttfts[1:])], "step_us": statistics.median(times),
                "step_range_us": [min(times), max(times)], "tok_per_s": batch * 1e6 / statistics.median(times)})
    if mode != "eager" and top >= 0:
        # the kernel-time split of graph replays (eager steps run the same kernels); after the timing, so the profiler
        # never overlaps a timed step. A profiler session slows later eager fastnf4 steps by ~20% (commit 5761de0),
        # hence ``run`` times all eager rows first and fastnf4 first.
        out.update(_profile(fn, 4, top))
    return out


def generate_kwargs(batch_new_tokens: int, compiled: bool = True, compile_config=None) -> dict:
    """``generate()`` arguments of the documented fast recipe: greedy, exactly ``batch_new_tokens`` new tokens (no
    early stop), a static cache; ``compiled=False`` turns transformers' automatic compile off (``disable_compile``);
    ``compile_config``: a ``transformers.CompileConfig`` (None: transformers' default)."""
    kw = dict(max_new_tokens=batch_new_tokens, min_new_tokens=batch_new_tokens, do_sample=False, pad_token_id=0,
              cache_implementation="static")
    if not compiled:
        kw["disable_compile"] = True
    elif compile_config is not None:
        kw["compile_config"] = compile_config
    return kw


def reset_generate_compile(model) -> None:
    """Forget what transformers compiled for ``model``'s ``generate`` (and Dynamo's caches), so that the next
    compiled ``generate`` compiles again."""
    _reset_dynamo()
    for attr in ("_compiled_call", "_last_compile_config"):
        if hasattr(model, attr):
            delattr(model, attr)


def _wall(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def generate_speed(model, ids, new_tokens: int, compiled: bool = True, compile_config=None, repeats: int = 3) -> dict:
    """Decode speed of greedy ``generate()`` from the prompt ``ids`` ([batch, prompt]) as a user calls it (the
    module docstring): ``first_call_s`` (for a compiled call: the one that compiles), ``total_s`` (``repeats`` calls
    of ``new_tokens`` tokens), ``prefill_s`` (``repeats`` calls of one new token: one forward of the prompt plus
    generate's own set-up, run after the long calls, because a static cache of another length would recompile the
    decode step), and ``decode_tok_per_s`` = batch * (new_tokens - 1) / (median total - median prefill)."""
    if new_tokens < 2:
        raise ValueError(f"new_tokens must be >= 2 to time decode steps, got {new_tokens}")
    kw = generate_kwargs(new_tokens, compiled, compile_config)
    with torch.inference_mode():
        first = _wall(lambda: model.generate(ids, **kw), 1)[0]
        total = _wall(lambda: model.generate(ids, **kw), repeats)
        prefill = _wall(lambda: model.generate(ids, **generate_kwargs(1, False)), repeats)
    decode = statistics.median(total) - statistics.median(prefill)
    return {"first_call_s": first, "total_s": total, "prefill_s": prefill,
            "decode_tok_per_s": ids.shape[0] * (new_tokens - 1) / decode if decode > 0 else None}


def bf16_skip_note(cfg, batch: int, prompt: int, steps: int, free: int) -> str | None:
    """``None`` when the bf16 model of ``cfg`` fits in ``free`` bytes at its largest ``batch`` by
    ``study.e2e.bf16_estimate``, else the "does not fit" note of its row."""
    from fastnf4.study.e2e import bf16_estimate

    need = bf16_estimate(cfg, batch, prompt, steps)["total"]
    if need <= free:
        return None
    return f"does not fit (estimated {need / 2**30:.1f} GiB > free {free / 2**30:.1f} GiB)"


def _reset_dynamo() -> None:
    try:
        torch._dynamo.reset()
    except Exception:  # noqa: BLE001 - torch without Dynamo: nothing to reset
        pass


def _measure(model, name: str, depth: int, variant: str, p: dict, opts, weights: float, build_peak: float,
             copy_gbps: float | None) -> list[dict]:
    """Every row of one variant's model: all eager rows first (a profiler session slows later eager fastnf4 steps
    by ~20%: commit 5761de0), then graph, then compiled rows."""
    gib = 2**30
    shapes = quantized_shapes(model)
    rows = []
    forward = None
    if "compiled" in p["modes"]:
        _reset_dynamo()  # nothing compiled for another variant's model (or before a patch) is reused
        forward = CompiledForward(model)
    try:
        for mode in p["modes"]:
            for batch in p["batches"]:
                row = dict(model=name, layers=depth, variant=variant, batch=batch, mode=mode, weights_gib=weights,
                           build_peak_gib=build_peak)
                torch.cuda.reset_peak_memory_stats()
                try:
                    row.update(decode_speed(model, batch, opts.prompt, opts.steps, mode, top=8, forward=forward))
                except Exception as e:  # a variant that cannot be captured or compiled is reported, not fatal
                    row["note"] = f"{type(e).__name__}: {str(e)[:160]}"
                row["decode_peak_gib"] = torch.cuda.max_memory_allocated() / gib
                if mode == "compiled" and getattr(opts, "e2e_generate", False) and "step_us" in row:
                    row.update(_generate_row(model, batch, opts, row["tok_per_s"]))
                if mode != "eager":
                    add_floor(row, shapes, copy_gbps)
                rows.append(row)
    finally:
        if forward is not None:
            del forward
            _reset_dynamo()
    return rows


def _generate_row(model, batch: int, opts, step_tok_per_s: float) -> dict:
    """The ``--e2e-generate`` figures of one compiled row (module docstring); transformers' compile of the decode
    step is its own (Dynamo reset before and after), a failure is the row's ``generate_note``."""
    ids = torch.randint(0, model.config.vocab_size, (batch, opts.prompt), device="cuda")
    reset_generate_compile(model)
    try:
        g = generate_speed(model, ids, opts.steps)
    except Exception as e:  # noqa: BLE001 - reported in the row, the run goes on
        return {"generate_note": f"{type(e).__name__}: {str(e)[:160]}"}
    finally:
        reset_generate_compile(model)
    tok = g["decode_tok_per_s"]
    return {"generate_tok_per_s": tok, "generate_vs_step": tok / step_tok_per_s if tok else None,
            "generate_compile_s": g["first_call_s"], "generate_total_s": g["total_s"], "generate_prefill_s": g["prefill_s"]}


@register("e2e")
def run(opts) -> dict:
    from fastnf4.bench.harness import bnb_version, copy_bandwidth
    from fastnf4.integrations import bitsandbytes as integ
    from fastnf4.study.e2e import REPLACERS, build_config, build_model

    p = plan(opts, bool(bnb_version()))
    variants = p["variants"]
    copy = copy_bandwidth()
    _free_memory()
    gib = 2**30
    rows = []
    for name in p["models"]:
        cfg = build_config(name, p["layers"])
        depth = cfg.num_hidden_layers
        kept = None  # the bitsandbytes model (and its memory figures), measured again patched as "bnb+fastnf4"
        for variant in progress(variants, desc=f"e2e {name}"):
            free = _free_memory()
            if variant == "bf16":  # decided from the estimate, before allocating anything
                note = bf16_skip_note(cfg, max(p["batches"]), opts.prompt, opts.steps, free)
                if note:
                    rows.append(dict(model=name, layers=depth, variant=variant, note=note))
                    continue
            torch.cuda.reset_peak_memory_stats()
            model = None
            if variant == "bnb+fastnf4" and kept is not None:
                model, build_peak, weights = kept
                kept = None
            else:  # ("bnb+fastnf4" without "bnb" builds the bitsandbytes model here)
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
                rows += _measure(model, name, depth, variant, p, opts, weights, build_peak, copy["GBps"])
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
            ("generate_tok_per_s", "{:.1f}"), ("generate_vs_step", "{:.2f}"),
            ("share_4bit", "{:.2f}"), ("four_bit_us", "{:.0f}"), ("floor_4bit_us", "{:.0f}"),
            ("four_bit_vs_floor", "{:.2f}"), ("compile_s", "{:.0f}"), ("weights_gib", "{:.1f}"),
            ("build_peak_gib", "{:.1f}"), ("decode_peak_gib", "{:.1f}"), ("note", "{}")]
    return {"rows": rows, "table": format_table(rows, cols), "copy": copy, "modes": p["modes"],
            "skipped_variants": p["skipped"]}
