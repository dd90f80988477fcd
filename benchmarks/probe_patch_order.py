"""Is the patched bitsandbytes model's graph step slower than fastnf4's own (bench e2e at 69901ab: 5-9% at batch 1)?
One process, MODEL cut to LAYERS, batch 1, graph decode steps (e2e.decode_speed, inference mode): the bitsandbytes
model patched while fresh, then unpatched, then patched again; then a fastnf4 model, twice. Prints the step time and the
GPU kernel time per step. usage: python benchmarks/probe_patch_order.py MODEL LAYERS"""
import sys, torch
from fastnf4.bench import e2e
from fastnf4.integrations import bitsandbytes as integ
name, layers = sys.argv[1], int(sys.argv[2])
def run(model, tag):
    r = e2e.decode_speed(model, 1, 160, 32, True, top=4)
    print(f"{tag:32s} step {r['step_us']:8.0f} us  gpu/step {r.get('gpu_us_per_step', 0):8.0f}", flush=True)
m = e2e._make(name, layers, "bnb")
integ.patch_bitsandbytes(("cuda",)); run(m, "bnb patched (fresh model)"); integ.unpatch_bitsandbytes()
run(m, "bnb unpatched"); integ.patch_bitsandbytes(("cuda",)); run(m, "bnb patched (after unpatched)"); integ.unpatch_bitsandbytes()
del m; torch.cuda.empty_cache()
f = e2e._make(name, layers, "fastnf4"); run(f, "fastnf4"); run(f, "fastnf4 again")
