"""Pure reads of each model weight's packed NF4 bytes (benchmarks/probe_read.cu: the dequantize's pattern and the decode
kernel's tile pattern with small blocks, with and without a 64 KiB table) against fastnf4.linear and (where installed)
bitsandbytes matmul_4bit at M = 1 on the same weight, all in one interleaved graph timing; the byte floor at the copy
rate of the same run, and issue 3's M = 1 targets (60% of the floor, 2.5x bitsandbytes) beside the fastest read.
usage: python benchmarks/probe_read.py [OUT.json]"""
import ctypes
import os

import torch

from fastnf4 import _cuda
from fastnf4.bench.common import bnb_functional
from fastnf4.bench.harness import copy_bandwidth, time_graphs
from probe_weights import model_weights, production, rotated, write_rows

VARIANTS = ["contig u4", "contig u8", "tile w4 u4", "tile w8 u4", "tile w16 u4", "tile w8 u8", "tile w16 u2",
            "table w8 u4", "table w16 u4"]


def main():
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_read.cu")
    lib = ctypes.CDLL(_cuda.compile_source(src, _cuda.device_arch(0), out_dir="/tmp/probe_read"))
    lib.probe_read.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_void_p,
                               ctypes.c_void_p]
    lib.probe_read.restype = ctypes.c_int
    sink = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
    gbs = copy_bandwidth()["GBps"]
    print(f"copy {gbs:.0f} GB/s", flush=True)
    rows = []
    for model, layer, n, k, w, q in model_weights(8e6):
        ws, qs = rotated(w, q)
        del ws
        x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
        def call(v, qq):
            rc = lib.probe_read(v, qq.packed.data_ptr(), n, k, sink.data_ptr(), torch.cuda.current_stream().cuda_stream)
            if rc != 0:
                raise RuntimeError(f"variant {VARIANTS[v]}: launch error {rc}")
        prov = {"linear": [lambda qq=qq: production(x, qq) for qq in qs]}
        if bnb_functional() is not None:
            import bitsandbytes

            bnbs = [(qq.packed, qq.to_bnb()[1]) for qq in qs]
            prov["bnb"] = [lambda b=b: bitsandbytes.matmul_4bit(x, b[0].t(), quant_state=b[1]) for b in bnbs]
        for v, name in enumerate(VARIANTS):
            prov[name] = [lambda qq=qq, v=v: call(v, qq) for qq in qs]
        t = {p: r["median_us"] for p, r in time_graphs(prov, per_graph=20, replays=10).items()}
        # the floor as bench matmul counts it (packed weight, statistics, x and y)
        floor = (q.nbytes() + 2 * k + 2 * n) / gbs / 1e3
        read = min(v for p, v in t.items() if p in VARIANTS)
        row = {"model": model, "layer": layer, "N": n, "K": k, "mb": q.nbytes() / 1e6, "floor_us": floor,
               "copy_gbs": gbs, **{f"{p}_us": v for p, v in t.items()}, "fastest_read_us": read,
               "target_floor_us": floor / 0.6}
        if "bnb" in t:
            row["target_bnb_us"] = t["bnb"] / 2.5
        rows.append(row)
        print(f"{model[:6]:6} {layer:8} {row['mb']:6.1f} MB floor {floor:5.1f} | " +
              " ".join(f"{p} {v:5.1f}" for p, v in t.items()) + f" | fastest read {read:5.1f}, targets: 60% floor "
              f"{row['target_floor_us']:5.1f}" + (f", 2.5x bnb {row['target_bnb_us']:5.1f}" if "bnb" in t else ""),
              flush=True)
        del qs
    write_rows(rows)


if __name__ == "__main__":
    main()
