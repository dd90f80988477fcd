"""Does patching bitsandbytes pay in eager mode? A bitsandbytes NF4 model (MODEL cut to LAYERS) decoded eager
(batch 1) and with a CUDA graph, TTFT too, unpatched and patched in alternating ROUNDS; plus the host cost per
call of one bitsandbytes Linear4bit (5120x5120) at M = 1 and 160. Everything runs under torch.no_grad() (as
transformers' generate() does), or with FASTNF4_PROBE_MODE=inference under torch.inference_mode() (as vLLM / TGI do;
before session 29 the patch sat at the Autograd keys, which inference mode skips, so this mode measured bitsandbytes
on both sides). usage: [FASTNF4_PROBE_MODE=inference] probe_patch.py MODEL LAYERS ROUNDS [JSON]"""
import json
import os
import sys

import torch

import fastnf4
from fastnf4.bench import e2e
from fastnf4.bench.harness import host_us_per_call
from fastnf4.integrations import bitsandbytes as integ
from fastnf4.study.e2e import bnb_linear


name, layers, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mode = os.environ.get("FASTNF4_PROBE_MODE", "no_grad")
ctx = torch.inference_mode if mode == "inference" else torch.no_grad
res = {"mode": mode, "host_us": {}, "rounds": []}
with ctx():
    lin = torch.nn.Linear(5120, 5120, bias=False, device="cuda", dtype=torch.bfloat16)
    b4 = bnb_linear(lin)
    for m in (1, 160):
        x = torch.randn(1, m, 5120, device="cuda", dtype=torch.bfloat16)
        for patched in (False, True):
            (fastnf4.patch_bitsandbytes if patched else fastnf4.unpatch_bitsandbytes)()
            t = host_us_per_call(lambda: b4(x))[0]
            res["host_us"][f"M={m} patched={patched}"] = t
            print(f"bitsandbytes Linear4bit M={m:4d} patched={patched!s:5s} host {t:6.1f} us/call", flush=True)
    fastnf4.unpatch_bitsandbytes()
model = e2e._make(name, layers, "bnb")
for r in range(rounds):
    for patched in (False, True):
        (fastnf4.patch_bitsandbytes if patched else fastnf4.unpatch_bitsandbytes)()
        integ.CALLS.clear()
        for graph in (False, True):
            with ctx():  # (decode_speed's own decorator is inference_mode)
                d = e2e.decode_speed.__wrapped__(model, 1, 160, 24, graph=graph, top=-1)
            row = dict(round=r, patched=patched, graph=graph, step_us=d["step_us"], ttft_us=d["ttft_us"],
                       calls=dict(integ.CALLS), keys=sorted(set(integ.patch_mode().values())))
            res["rounds"].append(row)
            print(f"round {r} patched={patched!s:5s} {'graph' if graph else 'eager'} step {d['step_us']:8.0f} us "
                  f"ttft {d['ttft_us']:8.0f} us  fastnf4 calls {sum(integ.CALLS.values())}", flush=True)
fastnf4.unpatch_bitsandbytes()
if len(sys.argv) > 4:
    json.dump(res, open(sys.argv[4], "w"), indent=1)
