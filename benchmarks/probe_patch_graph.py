"""Why a patched bitsandbytes model's graph step is slower than fastnf4's own layers (bench e2e at 69901ab: equal GPU
kernel time per step, 4-11% more wall time per step). One Linear (5120 x 5120, bf16, NF4 double quant) at M = 1 and 8:
fastnf4.Linear4bit against bitsandbytes' Linear4bit with fastnf4's patch, under inference mode. Per form: the CUDA
graph of 20 back-to-back calls, its replays timed (median us per call) and one replay's GPU activities listed (torch
profiler); the outputs of both forms are checked against each other first.
usage: python benchmarks/probe_patch_graph.py [OUT.json]"""
import collections
import json
import sys

import torch

import fastnf4
from fastnf4.integrations import bitsandbytes as integ
from fastnf4.study.e2e import bnb_linear, fastnf4_linear


def nodes(g) -> dict:
    """GPU activities of one replay by name (torch profiler: kernels, memsets, memcpys), the 8 most frequent."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    names = collections.Counter()
    busy = 0.0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            names[e.name[:60]] += 1
            busy += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    return {"activities": sum(names.values()), "busy_us": busy, "top": dict(names.most_common(8))}


def replay_us(g, calls: int) -> float:
    times = []
    for _ in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return sorted(times)[len(times) // 2]


def main():
    torch.manual_seed(0)
    lin = torch.nn.Linear(5120, 5120, bias=False, device="cuda", dtype=torch.bfloat16)
    forms = {"fastnf4": fastnf4_linear(lin), "bnb+fastnf4": bnb_linear(lin)}
    res = {}
    fastnf4.patch_bitsandbytes(("cuda",))
    print("patch keys", sorted(set(integ.patch_mode().values())), flush=True)
    for m in (1, 8):
        x = torch.randn(m, 5120, device="cuda", dtype=torch.bfloat16)
        with torch.inference_mode():
            ys = {name: f(x).float() for name, f in forms.items()}
        rel = ((ys["bnb+fastnf4"] - ys["fastnf4"]).norm() / ys["fastnf4"].norm()).item()
        print(f"M {m}: patched bitsandbytes vs fastnf4 output rel diff {rel:.2e}", flush=True)
        for name, f in forms.items():
            with torch.inference_mode():
                for _ in range(3):
                    f(x)
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for _ in range(20):
                        f(x)
            info = nodes(g)
            us = replay_us(g, 20)
            res[f"{name} M={m}"] = {"us_per_call": us, **info}
            print(f"{name:12s} M {m}: {us:6.2f} us/call, {info['activities']} GPU activities a replay of 20 calls, busy "
                  f"{info['busy_us'] / 20:6.2f} us/call: {info['top']}", flush=True)
    fastnf4.unpatch_bitsandbytes()
    if len(sys.argv) > 1:
        json.dump(res, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
