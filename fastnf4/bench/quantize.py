"""``fastnf4 bench quantize``: blockwise NF4 quantization (with and without double quantization) against
bitsandbytes' ``quantize_4bit``, both from the same random fp16/bf16 weights. bitsandbytes twice: its public
function (``bnb_us``: what a caller waits, its per-call host-to-device table copy included) and its kernels alone
(``bnb_kernels_us``, ``bnb_kernels``: the GPU-time comparison, since the public function's span is mostly host time
on the small weights: commit a6e6c0d)."""
from __future__ import annotations

import torch

import fastnf4
from fastnf4.bench.common import bnb_functional
from fastnf4.bench.dequant import add_timing
from fastnf4.bench.harness import (copy_bandwidth, dtype_nested_configs, format_table, progress, rotation_count,
                                    selected_shapes, time_cuda)
from fastnf4.bench.registry import register


def same_as_bnb(q: fastnf4.NF4Weight, packed: torch.Tensor, qs) -> bool:
    """Packed bytes and every statistic bit-identical to bitsandbytes' result."""
    ok = torch.equal(q.packed_u8, packed.reshape(-1).view(torch.uint8)) and torch.equal(q.absmax, qs.absmax)
    if qs.nested:
        ok = ok and q.nested and torch.equal(q.nested_absmax, qs.state2.absmax)
        ok = ok and torch.equal(q.offset.reshape(()), qs.offset.reshape(())) and torch.equal(q.nested_code, qs.state2.code)
    return bool(ok)


def bnb_kernels(w: torch.Tensor, blocksize: int, nested: bool, dynamic: torch.Tensor):
    """bitsandbytes' quantize as its GPU work alone: the ops ``F.quantize_4bit`` launches, without the Python around
    them (its ``get_4bit_type`` builds the 16-entry table from a list on every call, a host-to-device copy that waits
    for the stream: timed through the public function, bitsandbytes' span holds the host's work too)."""
    packed, absmax = torch.ops.bitsandbytes.quantize_4bit.default(w, blocksize, "nf4", torch.uint8)
    if not nested:
        return packed, absmax
    offset = absmax.mean()
    qabsmax, absmax2 = torch.ops.bitsandbytes.quantize_blockwise.default(absmax - offset, dynamic, 256)
    return packed, qabsmax, absmax2, offset


@register("quantize")
def run(opts) -> dict:
    F = bnb_functional()
    copy = copy_bandwidth()
    configs = dtype_nested_configs(selected_shapes(opts.models))
    rows = []
    for (model, layer, n, k), dtype, nested in progress(configs, desc="quantize"):
        g = torch.Generator(device="cuda").manual_seed(len(rows))
        w = torch.randn(n, k, dtype=dtype, device="cuda", generator=g)
        q = fastnf4.quantize(w, blocksize=opts.blocksize, double_quant=nested)
        moved = w.numel() * w.element_size() + q.nbytes()
        reps = rotation_count(moved)
        ws = [w] + [w.clone() for _ in range(reps - 1)]
        row = dict(op="quantize", model=model, layer=layer, N=n, K=k, dtype=str(dtype).removeprefix("torch."),
                   nested=nested, blocksize=opts.blocksize, bytes=moved)
        if F is not None:
            packed, qs = F.quantize_4bit(w, blocksize=opts.blocksize, compress_statistics=nested, quant_type="nf4")
            row["exact"] = same_as_bnb(q, packed, qs)
            dynamic = F.create_dynamic_map().to(w.device)
            mine = bnb_kernels(w, opts.blocksize, nested, dynamic)  # (the same work as the public call: checked)
            theirs = (packed, qs.absmax) if not nested else (packed, qs.absmax, qs.state2.absmax, qs.offset)
            row["bnb_kernels_same"] = all(torch.equal(a.reshape(-1), b.reshape(-1)) for a, b in zip(mine, theirs))
        # stream timing for both: bitsandbytes' quantize_4bit builds its code table from a Python list on
        # every call, a host-to-device copy that CUDA-graph capture refuses
        t = time_cuda([lambda i=i: fastnf4.quantize(ws[i], blocksize=opts.blocksize, double_quant=nested)
                       for i in range(reps)])
        add_timing(row, "fastnf4", {**t, "stream_us": t["median_us"]}, moved, copy)
        row["fastnf4_host_us"], row["fastnf4_queued_ahead"] = t["host_us"], t["queued_ahead"]
        if F is not None:
            # its per-call host sync waits out the GPU's sleep, so its calls are never queued ahead: no retries
            t = time_cuda([lambda i=i: F.quantize_4bit(ws[i], blocksize=opts.blocksize, compress_statistics=nested,
                                                       quant_type="nf4") for i in range(reps)], tries=1)
            add_timing(row, "bnb", {**t, "stream_us": t["median_us"]}, moved, copy)
            row["bnb_host_us"] = t["host_us"]
            row["speedup_vs_bnb"] = row["bnb_us"] / row["fastnf4_us"]
            if row["bnb_kernels_same"]:
                t = time_cuda([lambda i=i: bnb_kernels(ws[i], opts.blocksize, nested, dynamic) for i in range(reps)])
                row["bnb_kernels_us"], row["bnb_kernels_queued_ahead"] = t["median_us"], t["queued_ahead"]
                row["speedup_vs_bnb_kernels"] = row["bnb_kernels_us"] / row["fastnf4_us"]
        rows.append(row)
        del ws, w, q
        torch.cuda.empty_cache()
    cols = [("model", "{}"), ("layer", "{}"), ("N", "{}"), ("K", "{}"), ("dtype", "{}"), ("nested", "{}"),
            ("exact", "{}"), ("fastnf4_us", "{:.1f}"), ("fastnf4_pct_copy", "{:.1f}"), ("fastnf4_host_us", "{:.0f}"), ("bnb_us", "{:.1f}"),
            ("speedup_vs_bnb", "{:.2f}"), ("bnb_kernels_us", "{:.1f}"), ("speedup_vs_bnb_kernels", "{:.2f}")]
    table = f"copy bandwidth: {copy['GBps']:.0f} GB/s (read+write, 2 GiB)\n" + format_table(rows, cols)
    return {"copy": copy, "rows": rows, "table": table}
