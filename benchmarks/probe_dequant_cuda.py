"""The CUDA dequantize experiments (benchmarks/probe_dequant_cuda.cu; not used by the package) against the Triton
kernel, on the probe shapes of benchmarks/dequant_probe_case.py (bf16 out, graph timing, % of the 2 GiB copy of the same run).

Variants: words per lane per window (-DFASTNF4_DQ_U, separate builds) and the grid (resident: as many blocks as fit
at once, each warp walks windows; full: one window per warp). Every variant is first checked bitwise against the
Triton kernel on poisoned outputs: on the probe shapes, and on odd sizes / every blocksize / all three output dtypes
(the part window and part word after the loop).

    python benchmarks/probe_dequant_cuda.py [--json out.json]
"""
from __future__ import annotations

import ctypes
import json
import sys

import torch

from dequant_probe_case import SHAPES, Case
from fastnf4.bench.common import make_weight
from fastnf4.bench.harness import copy_bandwidth, environment, time_graph
from fastnf4.codebooks import kernel_code
import dequant_cuda_host as C
from fastnf4.ops.dequantize import kernel as K

LIBS = {u: C.lib_for(torch.device("cuda"), (f"-DFASTNF4_DQ_U={u}",)) for u in (2, 4, 8)}


def prep(lib, w, code, dtype=torch.bfloat16, grid=None):
    return C.Prepared(lib, w.packed_u8, w.absmax, code, w.blocksize, w.numel, w.nested_code, w.nested_absmax,
                      w.offset, 256, dtype, grid=grid)


CHUNKS = (1, 2, 3, 4, 6, 8, 10, 12)


def smem_prep(lib, w, code, dtype=torch.bfloat16, prefetch=0, grid=None):
    """The experimental shared-memory kernel (one block per SM, its whole range copied at once), or None when the
    weight needs more than 12 chunks per SM."""
    f = lib.lib.fastnf4_dequant_smem
    f.argtypes = [ctypes.POINTER(C.Params), ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                  ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    pieces = w.numel // 32
    grid = grid or lib.sms
    per = max(1, -(-pieces // grid))
    chunks = next((c for c in CHUNKS if c * 1024 >= per), None)
    if chunks is None:
        return None
    base = prep(lib, w, code, dtype)
    dt = C._DTYPES[dtype]

    def run(out):
        prm = C.Params.from_buffer_copy(base.params)
        prm.out = out.data_ptr()
        rc = f(ctypes.byref(prm), dt, base.nested, chunks, grid, per, prefetch,
               torch._C._cuda_getCurrentRawStream(out.device.index), base.pdl)
        assert rc == 0, rc
        return out
    return run


def bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def check_edges() -> int:
    """Odd sizes, every blocksize, three dtypes, both statistics forms: CUDA == Triton bitwise."""
    bad = 0
    code = kernel_code("nf4", torch.device("cuda"))
    for n, k in ((1, 1), (1, 7), (3, 37), (1, 8 * 32 * 8 + 9), (129, 1001), (1000, 1003), (4096, 4096)):
        for bs in (32, 64, 128, 256, 1024, 4096):
            for nested in (False, True):
                q, _ = make_weight(n, k, nested, bs, seed=n * k + bs)
                for dtype in (torch.bfloat16, torch.float16, torch.float32):
                    ref = torch.empty(q.numel, dtype=dtype, device="cuda")
                    K.Prepared(q.packed_u8, q.absmax, code, bs, q.numel, q.nested_code, q.nested_absmax,
                               q.offset)(ref)
                    runs = [(f"U{u} grid {g}", prep(lib, q, code, dtype, g)) for u, lib in LIBS.items()
                            for g in (None, 1, 3)]
                    runs += [(f"smem grid {g} pf {pf}", smem_prep(LIBS[4], q, code, dtype, pf, g)) for g in (None, 1, 3)
                             for pf in (0, 1)]
                    for name, run in runs:
                        if run is not None:
                            out = torch.full_like(ref, float("nan"))
                            run(out)
                            if not torch.equal(bits(out), bits(ref)):
                                bad += 1
                                print(f"MISMATCH {n}x{k} bs {bs} nested {nested} {dtype} {name}")
    torch.cuda.synchronize()
    return bad


def main() -> None:
    out_json = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    bad = check_edges()
    print(f"edge checks: {bad} mismatches")
    copy = copy_bandwidth()
    rows = []
    for n, k in SHAPES:
        for nested in (False, True):
            c = Case(n, k, nested)
            variants = {"triton": lambda i: c.prod[i](c.outs[i])}
            for pf in (0, 1):
                sm = [smem_prep(LIBS[4], w, c.code, prefetch=pf) for w in c.qs]
                if sm[0] is not None:
                    variants[f"smem pf{pf}"] = lambda i, sm=sm: sm[i](c.outs[i])
            for u, lib in LIBS.items():
                if u == 2:
                    continue
                res = [prep(lib, w, c.code) for w in c.qs]
                variants[f"cuda U{u}"] = lambda i, res=res: res[i](c.outs[i])
                if u == 4:
                    warps = lib.threads // 32
                    full = [prep(lib, w, c.code, grid=max(1, -(-(w.numel // 8 // lib.window_words) // warps)))
                            for w in c.qs]
                    variants["cuda U4 full"] = lambda i, full=full: full[i](c.outs[i])
            row = dict(shape=[n, k], nested=nested, moved=c.moved)
            for name, f in variants.items():
                c.outs[0].fill_(float("nan"))
                f(0)
                ok = bool(torch.equal(c.outs[0], c.ref))
                t = time_graph([lambda i=i, f=f: f(i) for i in range(c.reps)])
                row[name] = dict(us=t["median_us"], pct=100 * c.moved / t["median_us"] / 1e3 / copy["GBps"], exact=ok)
            rows.append(row)
            print(c.label(), "  ".join(f"{k_}: {v['pct']:5.1f}%{'' if v['exact'] else ' WRONG'}"
                                       for k_, v in row.items() if isinstance(v, dict)), flush=True)
            del c
            torch.cuda.empty_cache()
    print(f"copy {copy['GBps']:.0f} GB/s")
    if out_json:
        with open(out_json, "w") as f:
            json.dump(dict(env=environment(), copy=copy, edge_mismatches=bad, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
