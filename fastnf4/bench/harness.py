"""Timing and environment helpers shared by every benchmark.

Two timing methods, both with CUDA events, medians, and calls rotating over several input/output sets so
that the working set exceeds the L2 cache:

* ``time_graph`` (the headline figure): ``per_graph`` consecutive calls captured in one CUDA graph; the
  time of a replay divided by ``per_graph``, median over replays. This is how the kernels run in a
  graph-captured model: back to back, launch gaps included, no host overhead.
  ``time_graphs`` does the same for several providers with their replays interleaved (same clock state).
* ``time_cuda``: events around each single call on a stream, the GPU first given a sleep so that the host
  queues every call ahead of it. It adds the event and launch latency of each call (~2 us).
"""
from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import time
from typing import Callable, Iterable, Sequence

import torch

L2_BYTES = 60 * 2**20  # H100/H200; the rotation below aims at several times this


def rotation_count(bytes_per_call: int, min_working_set: int = 4 * L2_BYTES, cap: int = 32) -> int:
    return max(1, min(cap, math.ceil(min_working_set / max(bytes_per_call, 1))))


def time_cuda(calls: Sequence[Callable[[], object]], iters: int = 60, warmup: int = 5, tries: int = 3) -> dict:
    """Median / p20 / p80 microseconds of one call, rotating over ``calls``; ``host_us`` is the host time
    to issue one call (when it exceeds the GPU time, a real program would be host-bound).

    The GPU sleeps while the host queues every call, so that no call's events hold host time. Whether it did is
    checked: the first start event must still be pending once the last call is queued. If the GPU woke first (a
    host slower than the warm-up measured: an op whose kernels are separated by Python then times the host's
    gaps; commit 40fbd2c: an H100 ``bench quantize`` timed Gemma k+v fp16 at a 545 us median against 29 us in bf16),
    the timing is repeated with a 4x longer sleep, up to ``tries`` times; ``queued_ahead`` says whether the kept
    timing passed the check."""
    for i in range(warmup):
        calls[i % len(calls)]()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(warmup):
        calls[i % len(calls)]()
    host_s = (time.perf_counter() - t0) / warmup
    sleep_s = 2 * iters * host_s
    for _ in range(tries):
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        # keep the GPU busy (sleep counts ~2 GHz cycles) while the host enqueues every call
        torch.cuda._sleep(int(2e6 + sleep_s * 2e9))
        for i in range(iters):
            starts[i].record()
            calls[i % len(calls)]()
            ends[i].record()
        queued_ahead = not starts[0].query()
        torch.cuda.synchronize()
        if queued_ahead:
            break
        sleep_s *= 4
    return {**_summary([s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]), "host_us": host_s * 1e6,
            "queued_ahead": queued_ahead}


def _summary(us: Sequence[float]) -> dict:
    """Median / p20 / p80 of event times in microseconds."""
    q = statistics.quantiles(sorted(us), n=10)
    return {"median_us": statistics.median(us), "p20_us": q[1], "p80_us": q[7]}


def capture(calls: Sequence[Callable[[], object]], per_graph: int) -> tuple["torch.cuda.CUDAGraph", object]:
    """A CUDA graph of ``per_graph`` calls rotating over ``calls`` (warmed up on a side stream first), and what the
    last captured call returned (its output tensor, which every replay rewrites)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compilation, allocator) outside the capture
        for i in range(3):
            calls[i % len(calls)]()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    out = None
    with torch.cuda.graph(graph):
        for i in range(per_graph):
            out = calls[i % len(calls)]()
    return graph, out


def time_graphs(providers: dict[str, Sequence[Callable[[], object]]], per_graph: int = 20, replays: int = 15,
                warmup: int = 2) -> dict[str, dict]:
    """``time_graph`` for several providers at once, their replays interleaved: round r replays every provider's
    graph once, starting at provider r (mod count), so that all of them are timed in the same clock and power
    state. Under sustained GEMM load the H200 lowers its SM clock within a fraction of a second (1980 -> 1455 MHz,
    22a8dd2:NOTES.md); timed one after the other, a provider that comes later pays that alone (commit b4b3db5)."""
    graphs = {name: capture(calls, per_graph)[0] for name, calls in providers.items()}
    names = list(graphs)
    for _ in range(warmup):
        for name in names:
            graphs[name].replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for name in names:
        graphs[name].replay()
    host_s = time.perf_counter() - t0
    torch.cuda.synchronize()
    events = {name: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                     for _ in range(replays)] for name in names}
    # keep the GPU busy (sleep counts ~2 GHz cycles) while the host enqueues every replay
    torch.cuda._sleep(int(2e6 + 2 * replays * host_s * 2e9))
    for r in range(replays):
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            start, end = events[name][r]
            start.record()
            graphs[name].replay()
            end.record()
    torch.cuda.synchronize()
    out = {name: _summary([s.elapsed_time(e) * 1e3 / per_graph for s, e in events[name]]) for name in names}
    del graphs
    return out


def time_graph(calls: Sequence[Callable[[], object]], per_graph: int = 20, replays: int = 15) -> dict:
    """Per-call median / p20 / p80 microseconds from replays of a graph of ``per_graph`` calls."""
    return time_graphs({"": calls}, per_graph=per_graph, replays=replays)[""]


def time_both(calls: Sequence[Callable[[], object]]) -> dict:
    """``time_graph`` figures, plus ``stream_us`` from ``time_cuda``."""
    t = time_graph(calls)
    t["stream_us"] = time_cuda(calls)["median_us"]
    return t


def host_us_per_call(fn: Callable[[], object], n: int = 2000, warmup: int = 50) -> tuple[float, float]:
    """(host, with GPU) microseconds per call of ``fn``: wall time of ``n`` calls before synchronising (the
    host's cost, as long as the GPU keeps up) and after (the cost including the GPU's work)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6, (time.perf_counter() - t0) / n * 1e6


def copy_bandwidth(nbytes: int = 2 * 2**30) -> dict:
    """Device-to-device copy of ``nbytes``: GB/s counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    t = time_cuda([lambda: dst.copy_(src)], iters=20, warmup=3)
    return {"bytes": 2 * nbytes, "GBps": 2 * nbytes / t["median_us"] / 1e3, **t}


def _git_commit() -> str:
    if os.environ.get("FASTNF4_COMMIT"):  # set by tools/device_run.sh, where the tree has no .git
        return os.environ["FASTNF4_COMMIT"]
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        ).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment() -> dict:
    import fastnf4

    env = {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
        "sms": torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 0,
        "torch": torch.__version__, "fastnf4": fastnf4.__version__, "commit": _git_commit(),
        "python": platform.python_version(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    env["bitsandbytes"] = bnb_version()
    return env


def bnb_version() -> str | None:
    try:
        import bitsandbytes

        return bitsandbytes.__version__
    except Exception:  # noqa: BLE001 - any failure to import means "not usable here"
        return None


def progress(iterable, total: int | None = None, desc: str = ""):
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=desc, leave=False, dynamic_ncols=True)


def write_json(path: str, payload: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)


def model_shapes() -> list[tuple[str, str, int, int]]:
    """(model, layer, N, K) for every distinct linear and fused-linear shape of the three models."""
    with open(os.path.join(os.path.dirname(__file__), "models.json")) as f:
        models = json.load(f)
    rows = []
    for model, cfg in models.items():
        if model.startswith("_"):
            continue
        seen: dict[tuple[int, int], list[str]] = {}
        for group in ("linear", "fused"):
            for layer, (n, k) in cfg[group].items():
                seen.setdefault((n, k), []).append(layer.removesuffix("_proj"))
        rows += [(model, "+".join(names), n, k) for (n, k), names in seen.items()]
    return rows


def selected_shapes(models: Iterable[str] | None, layers: Iterable[str] | None = None) -> list[tuple[str, str, int, int]]:
    """``model_shapes()``, restricted to ``models`` and ``layers`` (e.g. "gate+up") when given (``--models``,
    ``--layers``)."""
    shapes = model_shapes()
    shapes = [s for s in shapes if s[0] in models] if models else shapes
    return [s for s in shapes if s[1] in layers] if layers else shapes


def parse_shapes(specs: Iterable[str]) -> list[tuple[str, str, int, int]]:
    """``--shapes`` ("NxK": out x in features, e.g. "320x5120") as ``model_shapes()`` rows, model "custom"; a
    malformed or non-positive entry is a ValueError naming it."""
    rows = []
    for spec in specs:
        parts = spec.lower().split("x")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"--shapes entries are NxK (out x in features, e.g. 320x5120), got {spec!r}")
        n, k = int(parts[0]), int(parts[1])
        if n < 1 or k < 1:
            raise ValueError(f"--shapes entries need N, K >= 1, got {spec!r}")
        rows.append(("custom", f"{n}x{k}", n, k))
    return rows


def dtype_nested_configs(shapes):
    """Every shape x (bf16, fp16) x (double quant off, on): the dequant and quantize benchmark grid."""
    return [(s, dt, nested) for s in shapes for dt in (torch.bfloat16, torch.float16) for nested in (False, True)]


def format_table(rows: list[dict], cols: list[tuple[str, str]]) -> str:
    """Plain-text table; ``cols`` is (key, format) pairs."""
    cells = [[(fmt.format(r[k]) if r.get(k) is not None else "-") for k, fmt in cols] for r in rows]
    heads = [k for k, _ in cols]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(heads)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(heads), line(["-" * w for w in widths]), *(line(c) for c in cells)])
