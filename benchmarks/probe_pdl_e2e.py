"""Does programmatic dependent launch pay inside a model? A fastnf4 NF4 model (MODEL cut to LAYERS) decoded with a
CUDA graph and eagerly, PDL off and on in alternating ROUNDS, batch 1 and 8. The switch toggled is ``FASTNF4_PDL``
(every kernel), or the variable named by FASTNF4_PROBE_PDL_VAR (e.g. FASTNF4_PDL_MMA: the CUDA matmul kernels only;
FASTNF4_PDL_WGMMA: the wgmma kernel), set to FASTNF4_PROBE_PDL_ON (default 1) when on. FASTNF4_PROBE_BATCHES (default
"1,8") and FASTNF4_PROBE_EAGER=0 (graph steps only) change what is timed.
usage: python benchmarks/probe_pdl_e2e.py MODEL LAYERS ROUNDS [JSON]"""
import json
import os
import sys

import torch

from fastnf4.bench import e2e
from fastnf4.ops.matmul import eager

name, layers, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = e2e._make(name, layers, "fastnf4")
var = os.environ.get("FASTNF4_PROBE_PDL_VAR", "FASTNF4_PDL")
on = os.environ.get("FASTNF4_PROBE_PDL_ON", "1")
batches = [int(b) for b in os.environ.get("FASTNF4_PROBE_BATCHES", "1,8").split(",")]
graphs = (True,) if os.environ.get("FASTNF4_PROBE_EAGER", "1") == "0" else (True, False)
rows = []
for r in range(rounds):
    for pdl in ("0", on):
        os.environ[var] = pdl
        eager._PLANS.clear()  # prepared launches read the switch when they are made
        for batch in batches:
            for graph in graphs:
                t = e2e.decode_speed(model, batch, 160, 16, graph=graph, top=-1)
                rows.append(dict(round=r, var=var, pdl=int(pdl), batch=batch, graph=graph, step_us=t["step_us"],
                                 ttft_us=t["ttft_us"]))
                print(f"round {r} pdl {pdl} b{batch} {'graph' if graph else 'eager'}: step {t['step_us']:8.0f} us, "
                      f"ttft {t['ttft_us']:8.0f} us", flush=True)
if len(sys.argv) > 4:
    json.dump(rows, open(sys.argv[4], "w"), indent=1)
