"""Plot decode tokens/s over batch size for each variant (fastnf4 / bitsandbytes / bf16) x mode (eager dashed,
CUDA graph solid), one panel per model, from the full-depth ``bench e2e`` results.
usage: python tools/plot_e2e.py [OUT.png] [JSON ...]
(default: benchmarks/results/h200-e2e-*.json -> benchmarks/results/h200-e2e.png; rows of runs cut to fewer
layers than the model has (`bench e2e --e2e-layers`) are left out; where two files hold the same model,
the newer run wins)"""
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
RESULTS = os.path.join(ROOT, "benchmarks", "results")
VARIANTS = [("fastnf4", "fastnf4 NF4", "tab:red"), ("bnb", "bitsandbytes NF4", "tab:blue"),
            ("bnb+fastnf4", "bitsandbytes NF4, fastnf4 patch", "tab:purple"),
            ("bf16", "bf16", "tab:gray")]
MODES = [("graph", "-", "CUDA graph"), ("eager", "--", "eager")]


def full_depth():
    with open(os.path.join(ROOT, "fastnf4", "bench", "models.json")) as f:
        return {k: v["num_hidden_layers"] for k, v in json.load(f).items() if not k.startswith("_")}


def load(paths):
    """{model: (payload, rows of that model)} from the newest full-depth run of each model."""
    depth = full_depth()
    runs = {}
    for path in paths:
        d = json.load(open(path))
        by_model = {}
        for r in d.get("rows", []):
            if r.get("layers") == depth.get(r.get("model")):
                by_model.setdefault(r["model"], []).append(r)
        for model, rows in by_model.items():
            if model not in runs or d.get("date", "") > runs[model][0].get("date", ""):
                runs[model] = (d, rows)
    return {m: runs[m] for m in depth if m in runs}


def main(out=os.path.join(RESULTS, "h200-e2e.png"), *paths):
    runs = load(paths or sorted(glob.glob(os.path.join(RESULTS, "h200-e2e-*.json"))))
    if not runs:
        sys.exit("no full-depth e2e rows found")
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 4.2), squeeze=False)
    for ax, (model, (d, rows)) in zip(axes[0], runs.items()):
        skipped = []
        for variant, label, color in VARIANTS:
            for mode, style, mode_label in MODES:
                pts = sorted((r["batch"], r["tok_per_s"]) for r in rows
                             if r["variant"] == variant and r.get("mode") == mode and r.get("tok_per_s"))
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", color=color)
            notes = {r["note"] for r in rows if r["variant"] == variant and r.get("note") and not r.get("tok_per_s")}
            skipped += [f"{label}: {n}" for n in sorted(notes)]
        if skipped:
            ax.text(0.98, 0.02, "\n".join(skipped), transform=ax.transAxes, fontsize=7, va="bottom", ha="right")
        batches = sorted({r["batch"] for r in rows if r.get("batch")})
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_yscale("log")
        ax.set_title(f"{model}, {rows[0]['layers']} layers (commit {d['env']['commit']})", fontsize=10)
        ax.set_xlabel("batch size")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("decode tokens/s")
    handles = [Line2D([], [], linestyle=style, marker="o", color=color, label=f"{label}, {mode_label}")
               for _, label, color in VARIANTS for _, style, mode_label in MODES]
    axes[0][0].legend(handles=handles, fontsize=7, handlelength=3)
    gpus = sorted({d["env"]["gpu"] for d, _ in runs.values()})
    commits = sorted({d["env"]["commit"] for d, _ in runs.values()})
    fig.suptitle(f"bench e2e decode throughput, random weights, prompt then greedy decode; {', '.join(gpus)}, "
                 f"commit {', '.join(commits)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
