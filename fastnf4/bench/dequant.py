"""``fastnf4 bench dequant``: dequantize throughput against the copy bandwidth and bitsandbytes."""
from __future__ import annotations

import torch

import fastnf4
from fastnf4.bench.common import bnb_functional, clone_weight, make_weight
from fastnf4.bench.harness import (copy_bandwidth, dtype_nested_configs, format_table, progress, rotation_count,
                                    selected_shapes, time_both, time_cuda)
from fastnf4.bench.registry import register


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def add_timing(row: dict, provider: str, t: dict, moved: int, copy: dict) -> None:
    """``<provider>_us`` (graph, median), p20/p80, GB/s and % of the 2 GiB copy bandwidth, and the same
    for single stream launches (``_stream_``)."""
    row[f"{provider}_us"], row[f"{provider}_p20_us"], row[f"{provider}_p80_us"] = t["median_us"], t["p20_us"], t["p80_us"]
    row[f"{provider}_GBps"] = moved / t["median_us"] / 1e3
    row[f"{provider}_pct_copy"] = 100 * row[f"{provider}_GBps"] / copy["GBps"]
    row[f"{provider}_stream_us"] = t["stream_us"]
    row[f"{provider}_stream_pct_copy"] = 100 * moved / t["stream_us"] / 1e3 / copy["GBps"]


@register("dequant")
def run(opts) -> dict:
    F = bnb_functional()
    copy = copy_bandwidth()
    configs = dtype_nested_configs(selected_shapes(opts.models))
    rows = []
    for (model, layer, n, k), dtype, nested in progress(configs, desc="dequant"):
        q, bnb = make_weight(n, k, nested, opts.blocksize, seed=len(rows))
        moved = q.nbytes() + q.numel * torch.finfo(dtype).bits // 8
        reps = rotation_count(moved)
        qs = [q] + [clone_weight(q) for _ in range(reps - 1)]
        outs = [torch.empty(q.shape, dtype=dtype, device="cuda") for _ in range(reps)]

        # correctness first, on poisoned outputs: bit-exact against bitsandbytes (or the reference)
        outs[0].fill_(float("nan"))
        fastnf4.dequantize(q, dtype=dtype, out=outs[0])
        if bnb is not None:
            packed, state = bnb
            state.dtype = dtype  # bitsandbytes dequantizes to the dtype recorded in its state
            expect = F.dequantize_4bit(packed, state)
        else:
            from fastnf4.ops.dequantize import naive

            expect = naive.dequantize(q.packed_u8, q.absmax, fastnf4.codebooks.kernel_code("nf4", q.device),
                                      q.blocksize, q.numel, dtype, q.nested_code, q.nested_absmax, q.offset)
        exact = bool(torch.equal(_bits(outs[0]).reshape(-1), _bits(expect).reshape(-1)))

        row = dict(op="dequant", model=model, layer=layer, N=n, K=k, dtype=str(dtype).removeprefix("torch."),
                   nested=nested, blocksize=opts.blocksize, bytes=moved, exact=exact)
        add_timing(row, "fastnf4", time_both([lambda i=i: fastnf4.dequantize(qs[i], dtype=dtype, out=outs[i])
                                              for i in range(reps)]), moved, copy)
        same = [torch.empty(moved // 2, dtype=torch.uint8, device="cuda") for _ in range(reps + 1)]
        # stream timing only: inside a CUDA graph a device copy becomes a copy-engine node (~64% of copy)
        row["copy_same_bytes_stream_us"] = time_cuda([lambda i=i: same[i].copy_(same[i + 1]) for i in range(reps)])["median_us"]
        row["copy_same_bytes_stream_pct_copy"] = 100 * moved / row["copy_same_bytes_stream_us"] / 1e3 / copy["GBps"]
        del same
        if bnb is not None:
            bnbs = [bnb] + [(w.packed, w.to_bnb()[1]) for w in qs[1:]]
            for _, st in bnbs:
                st.dtype = dtype
            add_timing(row, "bnb", time_both([lambda i=i: F.dequantize_4bit(bnbs[i][0], bnbs[i][1], out=outs[i])
                                              for i in range(reps)]), moved, copy)
            row["speedup_vs_bnb"] = row["bnb_us"] / row["fastnf4_us"]
            row["speedup_vs_bnb_stream"] = row["bnb_stream_us"] / row["fastnf4_stream_us"]
        rows.append(row)
        del qs, outs, bnb
        torch.cuda.empty_cache()
    cols = [("model", "{}"), ("layer", "{}"), ("N", "{}"), ("K", "{}"), ("dtype", "{}"), ("nested", "{}"),
            ("bytes", "{:.3g}"), ("exact", "{}"), ("fastnf4_us", "{:.1f}"), ("fastnf4_pct_copy", "{:.1f}"),
            ("fastnf4_stream_pct_copy", "{:.1f}"), ("copy_same_bytes_stream_pct_copy", "{:.1f}"),
            ("bnb_us", "{:.1f}"), ("bnb_pct_copy", "{:.1f}"), ("speedup_vs_bnb", "{:.2f}")]
    table = f"copy bandwidth: {copy['GBps']:.0f} GB/s (read+write, 2 GiB)\n" + format_table(rows, cols)
    return {"copy": copy, "rows": rows, "table": table}
