"""Decode kernels (M <= 2): the default plan against forced block-local plans (kernel, S, cluster size, split-major),
graph timing with rotated weights as probe_decode.py; each forced plan is checked bit for bit against the global
settle of the same split first (fresh x, outputs poisoned).
usage: python benchmarks/probe_forced_plans.py N K M PLAN [PLAN ...]   PLAN = kernel:S:cluster:major, e.g. 5:6:3:1
(kernel 0 = 16 warps, 5 = 20 warps; cluster 1 = one block)."""
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import copy_bandwidth, rotation_count, time_graph
from fastnf4.ops.matmul import gemv_mma

n, k, m = (int(a) for a in sys.argv[1:4])
plans = [tuple(int(v) for v in a.split(":")) for a in sys.argv[4:]]
bw = copy_bandwidth(2**30)["GBps"]
q = fastnf4.quantize(torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02)
reps = rotation_count(q.nbytes())
qs = [q] + [clone_weight(q) for _ in range(reps - 1)]
x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
floor = (q.nbytes() + 2 * m * k + 2 * m * n) / bw / 1e3
slices = -(-k // 128)
line = f"{n:5d}x{k:5d} M {m} floor {floor:5.1f}:"
pr = gemv_mma.Prepared(x, *linear_args(q), None)
t = time_graph([lambda i=i: gemv_mma.launch(x, *linear_args(qs[i])) for i in range(reps)])
line += f" default [v{pr.v} {pr.splits}x{pr.params.slices_per_split} l{pr.params.local} c{pr.params.lcluster}" \
        f" xs{pr.params.xs}] {t['median_us']:6.2f}"
for kernel, s, lc, major in plans:
    sp = (s, -(-slices // s))
    try:
        p = gemv_mma.Prepared(x, *linear_args(q), sp, kernel, True, lc, bool(major))
    except ValueError as e:
        line += f" | {kernel}:{s}:{lc}:{major} refused ({e})"
        continue
    y = p(x, torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16))
    yg = gemv_mma.launch(x, *linear_args(q), y=torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16),
                         splits=sp, kernel=kernel, local=False)
    ok = bool(torch.isfinite(y).all()) and torch.equal(y, yg)
    ps = [gemv_mma.Prepared(x, *linear_args(qs[i]), sp, kernel, True, lc, bool(major)) for i in range(reps)]
    t = time_graph([lambda i=i: ps[i](x) for i in range(reps)])
    line += f" | {kernel}:{s}:{lc}:{major} [l{p.params.local} xs{p.params.xs}] {t['median_us']:6.2f}" \
            f"{'' if ok else ' WRONG'}"
print(line, flush=True)
