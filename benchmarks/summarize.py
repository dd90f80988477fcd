"""Markdown summary of committed benchmark JSON (the README's tables come from here).
usage: python benchmarks/summarize.py benchmarks/results/h200-dequant.json [...]"""
import json
import sys
from collections import defaultdict


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
    print(f"`fastnf4 bench quantize` on {d['env']['gpu']} (commit {d['env']['commit']}); NF4, blocksize 64, bf16 and fp16 in; "
          "stream timing; speedup over bitsandbytes `quantize_4bit`, range over dtype.\n")
    groups = defaultdict(list)
    for r in d["rows"]:
        groups[(r["model"], r["layer"], r["N"], r["K"], r["nested"])].append(r)
    print("| model | layer | N x K | double quant | fastnf4 us | bitsandbytes us | speedup | exact |")
    print("|---|---|---|---|---|---|---|---|")
    for (m, layer, n, k, nested), rs in groups.items():
        s = [r["speedup_vs_bnb"] for r in rs]
        print(f"| {m} | {layer} | {n}x{k} | {'yes' if nested else 'no'} | {min(r['fastnf4_us'] for r in rs):.0f} | "
              f"{min(r['bnb_us'] for r in rs):.0f} | {min(s):.2f}-{max(s):.2f} | {all(r['exact'] for r in rs)} |")


if __name__ == "__main__":
    for path in sys.argv[1:]:
        d = json.load(open(path))
        {"dequant": dequant, "quantize": quantize}[d["benchmark"]](d)
        print()
