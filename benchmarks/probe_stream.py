"""Read bandwidth of the weight-stream patterns of the tensor-core kernels alone (benchmarks/probe_stream.cu):
cp.async of 32 / 64 / 128 bytes per row per stage (wgmma.cu reads 32) and TMA boxes, 128 rows per block, two
blocks per SM, on the packed bytes of model weights (> L2), against a device copy of the same bytes in the same run.
usage: python benchmarks/probe_stream.py [JSON]"""
import ctypes
import json
import os
import sys

import torch

from fastnf4 import _cuda
from fastnf4.bench.harness import time_cuda

VARIANTS = ["cp 32 B x 6", "cp 32 B x 12", "cp 64 B x 6", "cp 128 B x 2", "cp 128 B x 3", "tma 32 B x 6",
            "tma 128 B x 2", "tma 128 B x 3", "tma 128 B x 4"]


def main():
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_stream.cu")
    lib = ctypes.CDLL(_cuda.compile_source(src, "sm_90a", out_dir="/tmp/probe_stream"))
    lib.probe_stream.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_void_p,
                                 ctypes.c_void_p]
    lib.probe_stream.restype = ctypes.c_int
    sink = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
    out = {"env": {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("FASTNF4_COMMIT", "?")}, "rows": []}
    for name, n, k in (("llama gate_up", 57344, 8192), ("llama down", 8192, 28672), ("qwen o", 5120, 8192)):
        w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(w)
        nbytes = w.numel()
        row = {"weight": name, "N": n, "K": k, "bytes": nbytes}
        row["copy_gbs"] = 2 * nbytes / time_cuda([lambda: dst.copy_(w)])["median_us"] / 1e3  # read + write
        stream = torch.cuda.current_stream().cuda_stream
        for v, label in enumerate(VARIANTS):
            def run(v=v):
                rc = lib.probe_stream(v, w.data_ptr(), n, k // 2, sink.data_ptr(), stream)
                if rc != 0:
                    raise RuntimeError(f"variant {label}: launch error {rc}")
            run()
            torch.cuda.synchronize()
            row[label] = nbytes / time_cuda([run])["median_us"] / 1e3
        out["rows"].append(row)
        print(f"{name:14} {nbytes / 1e6:6.0f} MB  copy {row['copy_gbs']:6.0f} GB/s  " +
              "  ".join(f"{lab} {row[lab]:5.0f}" for lab in VARIANTS), flush=True)
    if len(sys.argv) > 1:
        json.dump(out, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
