"""PDL for the wgmma kernel (FASTNF4_PDL_WGMMA): on every model weight of >= 8 MB at the given M, the default plan
launched without PDL, with PDL (table built before the wait), and with PDL plus an L2 prefetch of the first weight
steps before the wait; optionally also the kernel of another wgmma.cu (--head FILE: e.g. the previous commit's, whose
Params lack the two PDL fields) to see what the prologue change costs without PDL. Checks first (fresh data, outputs
poisoned): every arm's bits equal the no-PDL arm's, error within 2x cuBLAS's; then one interleaved graph timing per
(weight, M) with bf16 cuBLAS on the unquantized weight (back-to-back calls: where PDL can overlap a call's set-up with
the previous call's drain). usage: python benchmarks/probe_wgmma_pdl.py [--ms 16,32] [--head FILE] [--json FILE]"""
import ctypes
import json
import os
import sys

import torch

import fastnf4
from fastnf4 import _cuda
from fastnf4.api import linear_args
from fastnf4.bench.harness import environment, time_graphs
from fastnf4.ops.matmul import wgmma
from probe_weights import model_weights, rotated

argv = sys.argv[1:]
ms = [int(v) for v in argv[argv.index("--ms") + 1].split(",")] if "--ms" in argv else [16, 32]
head_src = argv[argv.index("--head") + 1] if "--head" in argv else None
ARMS = {"pdl0": "0", "pdl1": "1", "pdl2": "2"}


class _Head:
    """wgmma.Prepared over another build of wgmma.cu whose Params end before the PDL fields (module globals
    swapped while a call is made: Python runs only at capture time)."""

    def __init__(self, src):
        class HeadParams(ctypes.Structure):
            _fields_ = [f for f in wgmma.Params._fields_ if f[0] not in ("pdl", "code_const")]
        self.params_cls = HeadParams
        lib = ctypes.CDLL(_cuda.compile_source(src, _cuda.device_arch(0) + "a"))
        with self._swap():
            self.lib = wgmma._Lib(lib, 0)

    def _swap(self):
        head = self

        class Swap:
            def __enter__(self):
                self.saved = wgmma.Params, wgmma._lib_for
                wgmma.Params = head.params_cls
                wgmma._lib_for = lambda index: head.lib if hasattr(head, "lib") else None

            def __exit__(self, *exc):
                wgmma.Params, wgmma._lib_for = self.saved
        return Swap()

    def prepare(self, q):
        with self._swap():
            p = wgmma.Prepared(*linear_args(q)[:-1])
        return lambda x, y=None: self.call(p, x, y)

    def call(self, p, x, y):
        with self._swap():
            return p(x, y=y)


def prepare(q, pdl):
    os.environ["FASTNF4_PDL_WGMMA"] = pdl
    try:
        p = wgmma.Prepared(*linear_args(q)[:-1])
    finally:
        os.environ.pop("FASTNF4_PDL_WGMMA", None)
    assert p.params.pdl == int(pdl), (p.params.pdl, pdl)
    return p


head = _Head(head_src) if head_src else None
torch.manual_seed(0)
rows = []
for model, layer, n, k, w, q in model_weights():
    wts, qs = rotated(w, q)
    arms = {name: [prepare(qq, pdl) for qq in qs] for name, pdl in ARMS.items()}
    if head is not None:
        arms["head"] = [head.prepare(qq) for qq in qs]
    wd = None
    for m in ms:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        if wd is None:
            wd = fastnf4.dequantize(q)
        ref = x.double() @ wd.double().T
        rel = lambda t: ((t.double() - ref).norm() / ref.norm()).item()  # noqa: E731
        base = None
        for name, ps in arms.items():
            y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            out = ps[0](x, y=y)
            torch.cuda.synchronize()
            err = rel(out) / rel(x @ wd.T)
            assert torch.isfinite(out).all() and err <= 2.0, (model, layer, m, name, err)
            if base is None:
                base = out.clone()
            assert torch.equal(out, base), (model, layer, m, name, "bits differ from pdl0")
        fns = {"cublas": [lambda i=i: x @ wts[i].T for i in range(len(wts))]}
        for name, ps in arms.items():
            fns[name] = [lambda p=p: p(x) for p in ps]
        t = time_graphs(fns, per_graph=20, replays=10)
        row = dict(model=model, layer=layer, N=n, K=k, M=m, err_ratio=err,
                   **{f"{a}_us": t[a]["median_us"] for a in fns})
        rows.append(row)
        print(f"{model[:6]:6s} {layer:8s} M {m:3d} cublas {row['cublas_us']:7.1f} " +
              " ".join(f"{a} {row[a + '_us']:7.1f}" for a in arms), flush=True)
    wts = qs = arms = wd = fns = ref = None  # the next weight's buffers in their place
    torch.cuda.empty_cache()
if "--json" in argv:
    json.dump({"env": environment(), "rows": rows}, open(argv[argv.index("--json") + 1], "w"), indent=1)
