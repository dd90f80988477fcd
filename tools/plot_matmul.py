"""Plot time / NF4 byte floor over M for each provider, one panel per model (the weights of a model summed).
usage: python tools/plot_matmul.py benchmarks/results/h200-matmul.json OUT.png"""
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PROVIDERS = [("fastnf4_us", "fastnf4 linear"), ("bnb_us", "bitsandbytes matmul_4bit"),
             ("cublas_bf16_us", "cuBLAS bf16 (unquantized)"), ("fastnf4_dq_cublas_us", "fastnf4 dequantize + cuBLAS")]


def main(path, out):
    d = json.load(open(path))
    models = sorted({r["model"] for r in d["rows"]})
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), sharey=True)
    for ax, model in zip(axes, models):
        sums = defaultdict(lambda: defaultdict(float))
        for r in d["rows"]:
            if r["model"] == model and r["layer"] in ("qkv", "gate_up", "down", "q+o", "o"):
                for key, _ in PROVIDERS + [("floor_us", "")]:
                    sums[r["M"]][key] += r.get(key) or 0.0
        ms = sorted(sums)
        for key, label in PROVIDERS:
            ax.plot(ms, [sums[m][key] / sums[m]["floor_us"] for m in ms], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{model}: fused qkv + o + gate_up + down")
        ax.set_xlabel("M (rows of x)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("time / NF4 byte floor")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{d['env']['gpu']}, commit {d['env']['commit']}")
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    main(*sys.argv[1:])
