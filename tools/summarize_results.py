"""Markdown tables of committed benchmark JSON (README.md's and docs/benchmarks.md's tables come from here).
usage: python tools/summarize_results.py benchmarks/results/h200-dequant.json [...]
       python tools/summarize_results.py --layer MODEL[,MODEL...] benchmarks/results/h200-matmul-s47-repeat.json
(--layer: the time of one decoder layer's projections per M, the README's headline table)"""
import json
import os
import sys
from collections import defaultdict

MODELS_JSON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fastnf4", "bench", "models.json")
LAYER_MS = (1, 8, 32, 128, 512, 2048)


def dequant(d):
    copy = d["copy"]["GBps"]
    print(f"`fastnf4 bench dequant` on {d['env']['gpu']} (commit {d['env']['commit']}, torch {d['env']['torch']}, "
          f"Triton {d['env']['triton']}, bitsandbytes {d['env']['bitsandbytes']}); copy bandwidth {copy:.0f} GB/s. "
          "NF4, blocksize 64, bf16 and fp16 out; % of copy bandwidth (graph timing), range over dtype; speedup over bitsandbytes.\n")
    groups = defaultdict(list)
    for r in d["rows"]:
        groups[(r["model"], r["layer"], r["N"], r["K"], r["nested"])].append(r)
    print("| model | layer | N x K | MB moved | double quant | fastnf4 % of copy | bitsandbytes % of copy | speedup | exact |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (m, layer, n, k, nested), rs in groups.items():
        f = [r["fastnf4_pct_copy"] for r in rs]
        b = [r["bnb_pct_copy"] for r in rs]
        s = [r["speedup_vs_bnb"] for r in rs]
        print(f"| {m} | {layer} | {n}x{k} | {rs[0]['bytes'] / 1e6:.0f} | {'yes' if nested else 'no'} | "
              f"{min(f):.1f}-{max(f):.1f} | {min(b):.1f}-{max(b):.1f} | {min(s):.2f}-{max(s):.2f} | "
              f"{all(r['exact'] for r in rs)} |")


def quantize(d):
    kernels = all("bnb_kernels_us" in r for r in d["rows"])  # older runs lack the kernels-alone timing
    print(f"`fastnf4 bench quantize` on {d['env']['gpu']} (commit {d['env']['commit']}); NF4, blocksize 64, bf16 and fp16 in; "
          "stream timing; times are the lower of the two input dtypes, speedups the range over them. bitsandbytes "
          "`quantize_4bit` as called (its per-call host-to-device table copy included)"
          + (", and its kernels alone (the GPU-time comparison).\n" if kernels else
             " only (this run predates the kernels-alone timing).\n"))
    groups = defaultdict(list)
    for r in d["rows"]:
        groups[(r["model"], r["layer"], r["N"], r["K"], r["nested"])].append(r)
    extra_head = " bitsandbytes kernels us | speedup over kernels |" if kernels else ""
    print("| model | layer | N x K | double quant | fastnf4 us | bitsandbytes us | speedup | exact |" + extra_head)
    print("|---|---|---|---|---|---|---|---|" + ("---|---|" if kernels else ""))
    for (m, layer, n, k, nested), rs in groups.items():
        s = [r["speedup_vs_bnb"] for r in rs]
        extra = ""
        if kernels:
            sk = [r["speedup_vs_bnb_kernels"] for r in rs]
            extra = f" {min(r['bnb_kernels_us'] for r in rs):.0f} | {min(sk):.2f}-{max(sk):.2f} |"
        print(f"| {m} | {layer} | {n}x{k} | {'yes' if nested else 'no'} | {min(r['fastnf4_us'] for r in rs):.0f} | "
              f"{min(r['bnb_us'] for r in rs):.0f} | {min(s):.2f}-{max(s):.2f} | {all(r['exact'] for r in rs)} |" + extra)
    flags = [(r, k) for r in d["rows"] for k in r if k.endswith("_queued_ahead")]  # older runs lack the flags
    if flags:
        late = [f"{r['model']} {r['layer']} {r['dtype']} {'nested' if r['nested'] else 'plain'} "
                f"{k.removesuffix('_queued_ahead')}" for r, k in flags if not r[k]]
        print(f"\nStream timings whose calls were not all queued while the GPU slept (host gaps may be inside them): "
              f"{len(late)} of {len(flags)}" + (f" ({', '.join(late)})" if late else "") + ".")


def matmul(d):
    print(f"`fastnf4 bench matmul` on {d['env']['gpu']} (commit {d['env']['commit']}); bf16 x, NF4 double-quant weights, "
          "graph timing. Over every weight of at least 8 MB packed (all shapes but k/v): range of the speedup of "
          "fastnf4 `linear` over bitsandbytes `matmul_4bit` and over bf16 cuBLAS on the unquantized weight, "
          "and fastnf4's share of the NF4 byte floor.\n")
    by_m = defaultdict(list)
    for r in d["rows"]:
        if r["nf4_mb"] >= 8:
            by_m[r["M"]].append(r)
    print("| M | path(s) | vs bitsandbytes | vs cuBLAS bf16 | % of NF4 byte floor | error / cuBLAS-on-dequantized error |")
    print("|---|---|---|---|---|---|")
    for m, rs in sorted(by_m.items()):
        paths = ", ".join(sorted({r["path"] for r in rs}))
        f = lambda key: f"{min(r[key] for r in rs):.2f}-{max(r[key] for r in rs):.2f}"  # noqa: E731
        print(f"| {m} | {paths} | {f('vs_bnb')} | {f('vs_cublas')} | {min(r['fastnf4_pct_floor'] for r in rs):.0f}-"
              f"{max(r['fastnf4_pct_floor'] for r in rs):.0f} | {f('err_ratio')} |")


def matmul_targets(d):
    """The project's matmul targets, each counted over the weights it names (row sizes are of the packed weight)."""
    rows = d["rows"]

    def line(text, ms, min_mb, ok, shown, max_mb=float("inf"), digits=2):
        rs = [r for r in rows if r["M"] in ms and min_mb <= r["nf4_mb"] < max_mb]
        good = [r for r in rs if ok(r)]
        lo, hi = min(shown(r) for r in rs), max(shown(r) for r in rs)
        miss = sorted((r for r in rs if not ok(r)), key=shown)
        names = ", ".join(f"{r['model'].split('-')[0]} {r['layer']}" + (f" M={r['M']}" if len(ms) > 1 else "")
                          + f" {shown(r):.{digits}f}" for r in miss[:6])
        more = f" (+{len(miss) - 6} more)" if len(miss) > 6 else ""
        print(f"| {text} | {lo:.{digits}f}-{hi:.{digits}f} | {len(good)} of {len(rs)} | {names}{more} |")

    print("The matmul targets in this run (\"x\": fastnf4 `linear`'s speedup; \"% floor\": its share of the NF4 byte floor):\n")
    print("| line | range | rows that meet it | the misses, worst first |")
    print("|---|---|---|---|")
    line("M = 1, >= 32 MB: >= 60% of the floor (% floor)", (1,), 32, lambda r: r["fastnf4_pct_floor"] >= 60,
         lambda r: r["fastnf4_pct_floor"])
    line("M = 1, >= 8 MB: >= 2.5x bitsandbytes", (1,), 8, lambda r: r["vs_bnb"] >= 2.5, lambda r: r["vs_bnb"])
    for m in (8, 16, 32):
        line(f"M = {m}, >= 8 MB: faster than cuBLAS bf16", (m,), 8, lambda r: r["vs_cublas"] > 1,
             lambda r: r["vs_cublas"])
        line(f"M = {m}, >= 8 MB: >= 3x bitsandbytes", (m,), 8, lambda r: r["vs_bnb"] >= 3, lambda r: r["vs_bnb"])
    line("M = 128, >= 8 MB: no slower than cuBLAS bf16", (128,), 8, lambda r: r["vs_cublas"] >= 1,
         lambda r: r["vs_cublas"])
    for m in (512, 2048):
        line(f"M = {m}, >= 8 MB: within 1.15x of cuBLAS bf16 (cuBLAS time / fastnf4 time >= 0.870)", (m,), 8,
             lambda r: r["fastnf4_us"] <= 1.15 * r["cublas_bf16_us"], lambda r: r["vs_cublas"],
             digits=3)  # the line is 0.870: two digits would show a miss of 0.866 as 0.87
    ms = sorted({r["M"] for r in rows})
    line("every M, k/v (< 8 MB): never slower than bitsandbytes", ms, 0,
         lambda r: r["fastnf4_us"] <= r["bnb_us"], lambda r: r["vs_bnb"], max_mb=8)
    fused = [r for r in rows if r["path"] != "dequant+matmul"]
    slow = [r for r in fused if r["fastnf4_us"] > r["fastnf4_dq_cublas_us"] * 1.02]
    print(f"\nFused rows (a fastnf4 matmul kernel, not dequantize + cuBLAS) more than 2% slower than fastnf4 dequantize + "
          f"cuBLAS: {len(slow)} of {len(fused)}"
          + "".join(f"; {r['model'].split('-')[0]} {r['layer']} M={r['M']} {r['path']} {r['fastnf4_us']:.1f} vs "
                    f"{r['fastnf4_dq_cublas_us']:.1f} us" for r in slow))


NAMES = {"llama-3.3-70b": "Llama-3.3-70B", "qwen3-32b": "Qwen3-32B", "gemma-3-27b": "Gemma-3-27B"}
VARIANTS = {"bf16": "bf16", "bnb": "bitsandbytes NF4", "bnb+fastnf4": "bitsandbytes NF4, fastnf4 patch",
            "fastnf4": "fastnf4 NF4"}


def e2e(d):
    """One table row per (model, variant): weights, eager TTFT per batch, decode tokens/s per (batch, mode)."""
    rows = [r for r in d["rows"] if r.get("step_us")]
    if not rows:
        return
    model, layers = rows[0]["model"], rows[0]["layers"]
    if not getattr(e2e, "header", False):
        print("| model | variant | weights GiB | TTFT b1 / b8 / b32 (ms) | b1 eager | b1 graph | b8 eager | b8 graph | "
              "b32 eager | b32 graph | 4-bit share (b1 graph) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        e2e.header = True
    for variant in ("bf16", "bnb", "bnb+fastnf4", "fastnf4"):
        rs = {(r["batch"], r["mode"]): r for r in rows if r["variant"] == variant}
        if not rs:
            continue
        ttft = " / ".join(f"{rs[(b, 'eager')]['ttft_us'] / 1e3:.0f}" for b in (1, 8, 32))
        tps = " | ".join(f"{rs[(b, m)]['tok_per_s']:.1f}" for b in (1, 8, 32) for m in ("eager", "graph"))
        share = rs[(1, "graph")].get("share_4bit")
        share = f"{share:.2f}" if variant != "bf16" and share is not None else "-"
        weights = next(iter(rs.values()))["weights_gib"]
        print(f"| {NAMES.get(model, model)} ({layers} layers) | {VARIANTS[variant]} | {weights:.1f} | {ttft} | {tps} "
              f"| {share} |")


def layer_sums(d, model):
    """One decoder layer of ``model`` (its unfused projections, q k v o gate up down, each once) per M: the sum of
    each provider's time over those weights. The bench times each distinct shape once (a row "q+o" is the shape q
    and o share), so a projection's time is that of the row whose layer names it."""
    with open(MODELS_JSON) as f:
        linears = [name.removesuffix("_proj") for name in json.load(f)[model]["linear"]]
    print(f"{NAMES.get(model, model)}, one decoder layer ({', '.join(linears)}; bf16 x, NF4 double-quant weights), "
          f"`fastnf4 bench matmul` on {d['env']['gpu']} (commit {d['env']['commit']}), us:\n")
    print("| M (tokens) | fastnf4 | bitsandbytes | cuBLAS bf16 (unquantized) | vs bitsandbytes | vs cuBLAS bf16 |")
    print("|---|---|---|---|---|---|")
    for m in LAYER_MS:
        total = defaultdict(float)
        for name in linears:
            (row,) = [r for r in d["rows"] if r["model"] == model and r["M"] == m and name in r["layer"].split("+")]
            for key in ("fastnf4_us", "bnb_us", "cublas_bf16_us"):
                total[key] += row[key]
        f, b, c = total["fastnf4_us"], total["bnb_us"], total["cublas_bf16_us"]
        print(f"| {m} | {f:.0f} | {b:.0f} | {c:.0f} | {b / f:.2f}x | {c / f:.2f}x |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--layer"]:
        for path in sys.argv[3:]:
            for model in sys.argv[2].split(","):
                layer_sums(json.load(open(path)), model)
                print()
        sys.exit(0)
    for path in sys.argv[1:]:
        d = json.load(open(path))
        {"dequant": dequant, "quantize": quantize, "matmul": matmul, "e2e": e2e}[d["benchmark"]](d)
        print()
        if d["benchmark"] == "matmul":
            matmul_targets(d)
            print()
