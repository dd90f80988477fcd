"""Decode kernel (M = 1) on the large weights: time per split-K choice and % of the NF4 byte floor, for the
build selected by FASTNF4_NVCC_FLAGS (diagnostic macros included); FASTNF4_PROBE_M = x rows (default 1; 3-32 take
the GEMM kernel); FASTNF4_PROBE_SET = large (default) / mid / all / gateup / every / model / big / small / regx. S = 0: the default
plan (with the block-local split-K where gemv_mma.local_plan takes it), g: the default plan with the global settle,
w: the 20-warp decode kernel's default plan (block-local where it takes it), n: the same for the 16-warp (variant 0)
kernel, sm / sp: the small-weight / split small-weight kernels (M <= 2), else S splits (global settle).
FASTNF4_PROBE_SRC = another gemv_mma.cu to build instead (same Params; it must not be given "0" plans that need the
block-local split-K it may lack: use g). FASTNF4_PROBE_EMPTY=1 first times a one-element fill (a launch alone).
FASTNF4_PROBE_NESTED=0 quantizes without double quant (float32 absmax). FASTNF4_PROBE_PLAN=1 adds the plan taken:
[kernel variant, S x slices per split, local, cluster, staged x holes] (g: split-major global), and first the
resident clusters of 2-8 blocks (FASTNF4_GEMV_CLUSTERS: the sizes the plans may take).
usage: python benchmarks/probe_decode.py [S|g|w|n ...]"""
import os
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import copy_bandwidth, rotation_count, time_graph
from fastnf4.ops.matmul import gemv_mma

if os.environ.get("FASTNF4_PROBE_SRC"):
    gemv_mma.SOURCE = os.environ["FASTNF4_PROBE_SRC"]  # before the first load (gemv_mma._lib_for is cached)
    gemv_mma.LOCAL_CLUSTERS = ()  # (an older build has no cluster form of the block-local split-K)
bw = copy_bandwidth(2**30)["GBps"]
splits = [a if a in ("g", "w", "n", "sm", "sp") else int(a) for a in sys.argv[1:]] or [0]
LARGE = [(57344, 8192), (8192, 28672), (10240, 8192), (51200, 5120), (5120, 25600)]
# Llama q+o, Qwen q / o, Gemma qkv / q, Qwen gate+up (21-68 MB packed)
MID = [(8192, 8192), (8192, 5120), (5120, 8192), (8192, 5376), (4096, 5376), (25600, 5120)]
# the fused gate+up projections of Llama / Gemma (not in the sets above)
GATE_UP = [(28672, 8192), (21504, 5376)]
# Gemma gate_up / down (the other model weights of > 96M elements)
GEMMA_BIG = [(43008, 5376), (5376, 21504)]
SETS = {"large": LARGE, "mid": MID, "all": LARGE + MID, "gateup": GATE_UP, "every": LARGE + MID + GATE_UP,
        "model": LARGE + MID + GATE_UP + GEMMA_BIG,  # every model weight of >= 11 MB the decode kernels take
        "big": [(5120, 25600), (25600, 5120), (28672, 8192), (21504, 5376)] + GEMMA_BIG,
        # the split small-weight kernel's weights at M = 1 (Gemma q / o, the k/v projections)
        "small": [(4096, 5376), (5376, 4096), (1024, 8192), (1024, 5120), (2048, 5376)],
        # the weights whose x is too large to stage whole at M = 2 (K > 5632): Llama q+o / down, Qwen / Gemma down
        "regx": [(8192, 8192), (5120, 25600), (8192, 28672), (5376, 21504)]}
if os.environ.get("FASTNF4_PROBE_EMPTY"):  # the graph time of a one-element fill: a kernel launch alone
    tiny = torch.zeros(1, device="cuda")
    print(f"one-element fill {time_graph([lambda: tiny.fill_(1.0)])['median_us']:6.2f} us", flush=True)
if os.environ.get("FASTNF4_PROBE_PLAN"):  # resident clusters of 2..8 blocks per decode kernel (bf16, nested)
    lib = gemv_mma._lib_for(torch.cuda.current_device())
    print("clusters", gemv_mma.local_clusters(),
          {v: [lib.clusters.get((0, v, 1, c), 0) for c in gemv_mma.CLUSTER_SIZES] for v in (0, gemv_mma.DECODE_WIDE)},
          flush=True)
for n, k in SETS[os.environ.get("FASTNF4_PROBE_SET", "large")]:
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    q = fastnf4.quantize(w, double_quant=os.environ.get("FASTNF4_PROBE_NESTED", "1") == "1")
    del w
    reps = rotation_count(q.nbytes())
    qs = [q] + [clone_weight(q) for _ in range(reps - 1)]
    m = int(os.environ.get("FASTNF4_PROBE_M", "1"))
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    floor = (q.nbytes() + 2 * m * k + 2 * m * n) / bw / 1e3
    slices = -(-k // 128)
    line = f"{n:5d}x{k:5d} floor {floor:5.1f} M {m}:"
    for s in splits:
        sp = None if s in (0, "g", "w", "n", "sm", "sp") else (s, -(-slices // s))
        local = False if s == "g" else None
        kernel = {"w": gemv_mma.DECODE_WIDE, "n": 0, "sm": gemv_mma.SMALL, "sp": gemv_mma.SPLIT}.get(s)
        t = time_graph([lambda i=i: gemv_mma.launch(x, *linear_args(qs[i]), splits=sp, local=local, kernel=kernel)
                        for i in range(reps)])
        line += f" s{s} {t['median_us']:6.1f} ({100 * floor / t['median_us']:3.0f}%)"
        if os.environ.get("FASTNF4_PROBE_PLAN"):  # which build and plan took it: [variant S x per, local, cluster, xs]
            pr = gemv_mma.Prepared(x, *linear_args(qs[0]), sp, kernel, local)
            pp = pr.params
            line += f" [v{pr.v} {pr.splits}x{pp.slices_per_split} l{pp.local} c{pp.lcluster} xs{pp.xs}" \
                    f"{' g' if pp.gsplit else ''}]"
    print(line, flush=True)
    del qs, q
