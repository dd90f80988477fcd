"""Whether the wgmma kernel's decode overlaps its tensor-core work (benchmarks/probe_overlap.cu, session 44): one block
of 3 warpgroups per SM runs each mode's loop; the times of the parts alone beside the time of both together, per
loop iteration (one iteration = the work of one K step of the 192-row wgmma build at BM 128 per warpgroup).
usage: python benchmarks/probe_overlap.py [OUT.json] [MODE ...]  (modes by number; default all)"""
import ctypes
import json
import os
import sys

import torch

from fastnf4 import _cuda

MODES = ["mma", "dec", "mma+dec", "alu", "mma+alu", "wg0 mma x3 | wg1-2 dec", "wg0 mma x3 | wg1-2 alu",
         "wg0 mma x3 alone", "wg1-2 dec alone", "wg1-2 alu alone", "mma+dec, turns", "mma, turns",
         "ring 2: wg1-2 dec -> wg0 mma x3", "ring 4: dec -> mma x3", "ring 4: dec -> mma x3, loads ahead",
         "ring 4: alu -> mma x3", "ring 4: dec (lane-0 polls) -> mma x3",
         "ring 4: dec (lane-0 polls) -> mma x3, loads ahead", "ring parts: mma loads only", "ring parts: barriers only",
         "ring parts: decoder stores only", "ring SS: dec -> SS mma x3", "ring SS: independent dec | SS mma x3",
         "SS mma x3 alone", "first: mma+dec", "first: mma+alu", "dec16 alone", "first: mma+dec16",
         "first: mma+dec bcast", "dec bcast alone", "first: mma+dec, stagger 1", "first: mma+dec, stagger 2",
         "first: mma+alu, stagger 1", "SS self: mma+dec", "SS self: mma+alu", "SS self: mma alone"]


def main():
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_overlap.cu")
    lib = ctypes.CDLL(_cuda.compile_source(src, "sm_90a", out_dir="/tmp/probe_overlap"))
    lib.probe_overlap_run.argtypes = [ctypes.c_int] * 3 + [ctypes.c_void_p] * 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sink = torch.zeros(1024, dtype=torch.int32, device="cuda")
    iters = 4096
    res = {}
    only = {int(a) for a in sys.argv[2:]}
    for mode, name in enumerate(MODES):
        if only and mode not in only and mode not in (0, 1, 3):  # the parts alone are always timed
            continue
        def run():
            rc = lib.probe_overlap_run(mode, iters, sms, sink.data_ptr(), torch.cuda.current_stream().cuda_stream)
            if rc != 0:
                raise RuntimeError(f"mode {name}: launch error {rc}")
        for _ in range(3):
            run()
        times = []
        for _ in range(9):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / iters)  # us per iteration
        res[name] = sorted(times)[len(times) // 2]
        print(f"  ({name}: {1e3 * res[name]:.1f} ns)", flush=True)
    torch.cuda.synchronize()
    print("ns per iteration (median of 9 launches, one block per SM):")
    for name in MODES:
        if name in res:
            print(f"  {name:26s} {1e3 * res[name]:8.1f}")
    pairs = [("mma+dec", "mma", "dec"), ("mma+alu", "mma", "alu"),
             ("wg0 mma x3 | wg1-2 dec", "wg0 mma x3 alone", "wg1-2 dec alone"),
             ("wg0 mma x3 | wg1-2 alu", "wg0 mma x3 alone", "wg1-2 alu alone"), ("mma+dec, turns", "mma", "dec"),
             ("ring 2: wg1-2 dec -> wg0 mma x3", "wg0 mma x3 alone", "wg1-2 dec alone"),
             ("ring 4: dec -> mma x3", "wg0 mma x3 alone", "wg1-2 dec alone"),
             ("ring 4: dec -> mma x3, loads ahead", "wg0 mma x3 alone", "wg1-2 dec alone"),
             ("ring 4: alu -> mma x3", "wg0 mma x3 alone", "wg1-2 alu alone"),
             ("ring 4: dec (lane-0 polls) -> mma x3", "wg0 mma x3 alone", "wg1-2 dec alone"),
             ("ring 4: dec (lane-0 polls) -> mma x3, loads ahead", "wg0 mma x3 alone", "wg1-2 dec alone"),
             ("ring parts: mma loads only", "wg0 mma x3 alone", "wg1-2 dec alone"),
             ("ring parts: barriers only", "wg0 mma x3 alone", "wg1-2 dec alone"),
             ("ring parts: decoder stores only", "wg0 mma x3 alone", "wg1-2 dec alone"),
             ("ring SS: dec -> SS mma x3", "SS mma x3 alone", "wg1-2 dec alone"),
             ("ring SS: independent dec | SS mma x3", "SS mma x3 alone", "wg1-2 dec alone"),
             ("first: mma+dec", "mma", "dec"), ("first: mma+alu", "mma", "alu"),
             ("first: mma+dec16", "mma", "dec16 alone"), ("first: mma+dec bcast", "mma", "dec bcast alone"),
             ("first: mma+dec, stagger 1", "mma", "dec"), ("first: mma+dec, stagger 2", "mma", "dec"),
             ("first: mma+alu, stagger 1", "mma", "alu"), ("SS self: mma+dec", "SS self: mma alone", "dec"),
             ("SS self: mma+alu", "SS self: mma alone", "alu")]
    for both, x, y in pairs:
        if not all(k in res for k in (both, x, y)):
            continue
        lo, hi = max(res[x], res[y]), res[x] + res[y]
        print(f"  {both:26s}: {1e3 * res[both]:7.1f} ns; parts {1e3 * res[x]:.1f} + {1e3 * res[y]:.1f}: "
              f"overlap {(hi - res[both]) / (hi - lo):.2f} (1 = full, 0 = none)")
    if len(sys.argv) > 1:
        commit_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".commit")
        commit = open(commit_file).read().strip() if os.path.exists(commit_file) else None
        json.dump({"device": torch.cuda.get_device_name(0), "commit": commit, "ns_per_iteration": {k: 1e3 * v for k, v in res.items()}},
                  open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
