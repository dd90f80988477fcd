"""A / B table of probe_wgmma_build.py rows (the JSON of several builds and rounds, e.g. from device_build_ab.sh):
per M and weight, the best time of each build over its rounds, its ratio to the first build's, and cuBLAS's time;
then the geometric mean of the ratios per M and build.
usage: python benchmarks/ab_summary.py FILE.json"""
import json
import math
import sys
from collections import defaultdict

rows = json.load(open(sys.argv[1]))
builds = list(dict.fromkeys(r["flags"] or "BASE" for r in rows))
best = defaultdict(dict)  # (M, weight) -> build -> (us, cublas_us)
for r in rows:
    key, b = (r["M"], f"{r['model'][:5]} {r['layer']}"), r["flags"] or "BASE"
    if b not in best[key] or r["us"] < best[key][b][0]:
        best[key][b] = (r["us"], r["cublas_us"], r["err_ratio"])
for m in sorted({k[0] for k in best}):
    print(f"M = {m}: us (ratio to {builds[0]}), cuBLAS us")
    logs = defaultdict(list)
    for key in [k for k in best if k[0] == m]:
        base = best[key][builds[0]][0]
        cells = []
        for b in builds:
            if b in best[key]:
                us, cub, err = best[key][b]
                logs[b].append(math.log(us / base))
                cells.append(f"{us:8.1f} ({us / base:.3f}, e{err:.2f})")
        print(f"  {key[1]:16s} " + " ".join(cells) + f"  cuBLAS {best[key][builds[0]][1]:.1f}")
    for b in builds:
        print(f"  geomean {b}: {math.exp(sum(logs[b]) / len(logs[b])):.3f} over {len(logs[b])}")
