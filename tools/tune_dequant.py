"""Sweep the dequantize kernel's tile (bytes per program) and warps on a few shapes; prints % of copy.
usage: python tools/tune_dequant.py [OUT.json]"""
import itertools
import json
import sys

import torch

import fastnf4
from fastnf4.bench.common import clone_weight, make_weight
from fastnf4.bench.harness import copy_bandwidth, rotation_count, time_graph
from fastnf4.codebooks import kernel_code
from fastnf4.ops.dequantize import kernel

SHAPES = [(8192, 8192), (8192, 5120), (4096, 5376), (57344, 8192)]


def main(out_path=None):
    copy = copy_bandwidth()["GBps"]
    print(f"copy {copy:.0f} GB/s")
    results = []
    for (n, k), nested, blocksize in itertools.product(SHAPES, (False, True), (64,)):
        q, _ = make_weight(n, k, nested, blocksize)
        moved = q.nbytes() + q.numel * 2
        reps = rotation_count(moved)
        qs = [q] + [clone_weight(q) for _ in range(reps - 1)]
        outs = [torch.empty(q.numel, dtype=torch.bfloat16, device="cuda") for _ in range(reps)]
        code = kernel_code("nf4", q.device)
        ref = fastnf4.dequantize(q).reshape(-1)
        line = []
        for tile, warps in itertools.product((1024, 2048, 4096), (4, 8)):
            def call(i, tile=tile, warps=warps):
                w = qs[i]
                kernel.launch(w.packed_u8, w.absmax, code, outs[i], w.blocksize, w.numel, w.nested_code,
                              w.nested_absmax, w.offset, w.nested_blocksize, tile_bytes=tile, num_warps=warps)
            outs[0].fill_(float("nan"))
            call(0)
            assert torch.equal(outs[0].view(torch.int16), ref.view(torch.int16)), (n, k, tile, warps)
            t = time_graph([lambda i=i: call(i) for i in range(reps)])
            pct = 100 * moved / t["median_us"] / 1e3 / copy
            results.append(dict(N=n, K=k, nested=nested, tile=tile, warps=warps, us=t["median_us"], pct=pct))
            line.append(f"{tile}/{warps}:{pct:.0f}")
        print(f"{n}x{k} nested={nested}: " + " ".join(line), flush=True)
        del qs, outs
    if out_path:
        json.dump({"copy_GBps": copy, "rows": results}, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
