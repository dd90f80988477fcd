"""``fastnf4 bench paper``: the paper's dequantization variants, bitsandbytes and fastnf4 in one run (see
:mod:`fastnf4.study.paper`), then the end-to-end decomposition of ``generate()`` time for Qwen3-32B
(:mod:`fastnf4.study.e2e`)."""
from __future__ import annotations

import torch

import fastnf4
from fastnf4.bench.common import bnb_functional, clone_weight, make_weight
from fastnf4.bench.harness import copy_bandwidth, format_table, progress, rotation_count, selected_shapes, time_graph
from fastnf4.bench.registry import register


@register("paper")
def run(opts) -> dict:
    from fastnf4.study.paper import PAPER_A100, VARIANTS, Variants, build

    study = Variants(build())
    sass = study.sass_counts()
    F = bnb_functional()
    copy = copy_bandwidth()
    rows = []
    for model, layer, n, k in progress(selected_shapes(opts.models), desc="paper"):
        q, bnb = make_weight(n, k, nested=False, blocksize=opts.blocksize, seed=n + k)
        moved = q.nbytes() + q.numel * 2
        reps = rotation_count(moved)
        qs = [q] + [clone_weight(w) for w in [q] * (reps - 1)]
        outs = [torch.empty(q.numel, dtype=torch.bfloat16, device="cuda") for _ in range(reps)]
        expect = (F.dequantize_4bit(*bnb) if bnb is not None else fastnf4.dequantize(q)).reshape(-1).view(torch.int16)
        row = dict(model=model, layer=layer, N=n, K=k, bytes=moved)
        providers = {f"v{v}": (lambda i, v=v: study.dequant(v, qs[i].packed_u8, qs[i].absmax, opts.blocksize, outs[i]))
                     for v in VARIANTS}
        providers["fastnf4"] = lambda i: fastnf4.dequantize(qs[i], out=outs[i])
        if bnb is not None:
            states = [w.to_bnb() for w in qs]
            providers["bnb"] = lambda i: F.dequantize_4bit(states[i][0], states[i][1], out=outs[i].view(q.shape))
        for name, fn in providers.items():
            outs[0].fill_(float("nan"))
            fn(0)
            row[f"{name}_exact"] = bool(torch.equal(outs[0].view(torch.int16), expect))
            t = time_graph([lambda i=i, fn=fn: fn(i) for i in range(reps)])
            row[f"{name}_us"] = t["median_us"]
            row[f"{name}_pct_copy"] = 100 * moved / t["median_us"] / 1e3 / copy["GBps"]
        row["shared_vs_tree"] = row["v0_us"] / row["v2_us"]
        row["shared_vs_global"] = row["v1_us"] / row["v2_us"]
        if bnb is not None:
            row["shared_vs_bnb"] = row["bnb_us"] / row["v2_us"]
        rows.append(row)
        del qs, outs
        torch.cuda.empty_cache()
    cols = [("model", "{}"), ("layer", "{}"), ("N", "{}"), ("K", "{}")] + [
        (f"{p}_pct_copy", "{:.1f}") for p in ("v0", "v1", "v2", "v3", "bnb", "fastnf4")] + [
        ("shared_vs_tree", "{:.2f}"), ("shared_vs_global", "{:.2f}"), ("shared_vs_bnb", "{:.2f}")]
    exact = all(v for r in rows for key, v in r.items() if key.endswith("_exact"))
    lines = [f"copy bandwidth {copy['GBps']:.0f} GB/s; every variant bit-exact: {exact}",
             "variants: " + "; ".join(f"v{v} = {name} ({sass.get(v, '?')} SASS instructions)" for v, name in VARIANTS.items()),
             format_table(rows, cols), "", "paper (A100) for comparison:"]
    lines += [f"  {k}: {v}" for k, v in PAPER_A100.items()]
    result = {"copy": copy, "rows": rows, "sass": sass}
    if not opts.no_e2e:
        from fastnf4.study.e2e import dequant_share

        e2e = dequant_share("qwen3-32b", layers=opts.e2e_layers or None)
        result["e2e"] = e2e
        cols = [("provider", "{}"), ("batch", "{}"), ("wall_s", "{:.3f}"), ("gpu_kernel_s", "{:.3f}"),
                ("dequant_s", "{:.3f}"), ("dequant_share_of_gpu", "{:.3f}"), ("dequant_share_of_wall", "{:.3f}")]
        lines += ["", f"generate(): qwen3-32b, {e2e['layers']} layers, prompt {e2e['prompt']}, {e2e['new_tokens']} new tokens, eager",
                  format_table(e2e["rows"], cols)]
    result["table"] = "\n".join(lines)
    return result
