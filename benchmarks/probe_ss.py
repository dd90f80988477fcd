"""Probe of probe_ss.cu (x as the wgmma A operand, the weights decoded once per K step into a bf16 tile of 256 rows in
shared memory as the B operand) against bf16 cuBLAS on the unquantized weight and the production ``fastnf4.linear``
at M around 128 on every model weight of >= 8 MB (graph timing, providers interleaved: ``harness.time_graphs``).
Before timing, every case is checked on fresh data with a poisoned output: error against a float64 product with the
dequantized weight, relative to cuBLAS's error on the same weight (the kernel multiplies by exactly the dequantized
weight: ~1), on odd M (one and two x tiles), double quant on and off, and forced split-K plans.
Builds: ``--builds "label:nvcc flags;..."`` (diagnostic macros PROBE_SS_NO_DECODE / PROBE_SS_NO_MMA give wrong results:
their checks are skipped); ``--shapes NxK,...`` limits the weights; PROBE_SS_SRC=probe_ss2.cu runs the
warp-specialized form instead (probe_ss3.cu: with TMA copies; probe_ss4.cu: 128-row tiles, 2 decode warpgroups).
usage: python benchmarks/probe_ss.py [--m 128,256] [--splits S] [--builds ...] [--shapes ...] [JSON]"""
import ctypes
import json
import os
import sys

import torch

import fastnf4
from fastnf4 import _cuda
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import environment, rotation_count, time_graphs
from probe_weights import model_weights

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS = 256  # weight rows per block


class Params(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in ("packed", "absmax", "nested_code", "nested_absmax", "offset",
                                                       "code", "x", "y", "y32")] + \
               [(name, ctypes.c_longlong) for name in ("M", "N", "K", "splits", "per")]




def build(flags: str = ""):
    src = os.path.join(HERE, os.environ.get("PROBE_SS_SRC", "probe_ss.cu"))
    lib = ctypes.CDLL(_cuda.compile_source(src, "sm_90a", extra=tuple(flags.split())))
    lib.probe_ss_run.argtypes = [ctypes.POINTER(Params), ctypes.c_int, ctypes.c_void_p]
    assert lib.probe_ss_params_size() == ctypes.sizeof(Params)
    assert lib.probe_ss_prepare() == 0
    try:
        lib.rows = lib.probe_ss_rows()  # weight rows per block (probe_ss4.cu: 128)
    except AttributeError:
        lib.rows = ROWS
    return lib


SMS = torch.cuda.get_device_properties(0).multi_processor_count


def plan(m: int, n: int, k: int, splits: int | None = None, rows: int = ROWS) -> tuple[int, int]:
    """(S, K steps per split, a multiple of 4): fewest rounds of K steps over the SMs, each split >= 8 steps."""
    steps, tiles = k // 64, n // rows * -(-m // 128)
    best = None
    for s in ([splits] if splits else range(1, 17)):
        per = -(-steps // s)
        per = -(-per // 4) * 4
        s_eff = -(-steps // per)
        if per < 8 and s > 1 and not splits:
            continue
        cost = -(-tiles * s_eff // SMS) * per + (2 if s_eff > 1 else 0)  # partials: a few steps' worth
        if best is None or cost < best[0]:
            best = (cost, s_eff, per)
    return best[1], best[2]


def ss_linear(lib, x, q, y=None, splits=None):
    m, k = x.shape
    n = q.shape[0]
    assert x.dtype == torch.bfloat16 and q.blocksize == 64 and k % 256 == 0 and n % lib.rows == 0
    nested = q.nested_code is not None
    s, per = plan(m, n, k, splits, lib.rows)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device) if y is None else y
    y32 = torch.empty(s, m, n, dtype=torch.float32, device=x.device) if s > 1 else None
    code = fastnf4.codebooks.kernel_code(q.quant_type, q.device)
    p = Params(packed=q.packed_u8.data_ptr(), absmax=q.absmax.data_ptr(),
               nested_code=q.nested_code.data_ptr() if nested else None,
               nested_absmax=q.nested_absmax.data_ptr() if nested else None,
               offset=q.offset.data_ptr() if nested else None, code=code.data_ptr(), x=x.data_ptr(),
               y=out.data_ptr(), y32=y32.data_ptr() if y32 is not None else None, M=m, N=n, K=k, splits=s, per=per)
    rc = lib.probe_ss_run(ctypes.byref(p), int(nested), torch.cuda.current_stream().cuda_stream)
    assert rc == 0, rc
    if s > 1:
        torch.sum(y32, 0, out=y32[0])
        out.copy_(y32[0])
    return out


def err_ratio(y, x, q):
    wd = fastnf4.dequantize(q, x.dtype)
    ref = x.double() @ wd.double().T
    rel = lambda t: ((t.double() - ref).norm() / ref.norm()).item()  # noqa: E731
    return rel(y) / rel(torch.nn.functional.linear(x, wd)), bool(torch.isfinite(y).all())


def checks(lib, bound=1.1):
    worst = 0.0
    torch.manual_seed(1)
    for n, k, nested in [(512, 1024, True), (768, 2560, False), (256, 4096, True), (1280, 512, True)]:
        q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05, blocksize=64,
                             double_quant=nested)
        for m in (1, 37, 128, 200, 256):
            for splits in (None, 1, 2, 3):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                ss_linear(lib, x, q, y, splits)
                r, finite = err_ratio(y, x, q)
                assert finite and r <= bound, (n, k, nested, m, splits, r)
                worst = max(worst, r)
    return worst


def main():
    argv = sys.argv[1:]
    ms = [int(v) for v in argv[argv.index("--m") + 1].split(",")] if "--m" in argv else [128]
    force = int(argv[argv.index("--splits") + 1]) if "--splits" in argv else None
    out = [a for a in argv if a.endswith(".json")]
    spec = argv[argv.index("--builds") + 1] if "--builds" in argv else "ss:"
    shapes = argv[argv.index("--shapes") + 1].split(",") if "--shapes" in argv else None
    libs = {label: (build(flags), flags) for label, flags in (part.split(":", 1) for part in spec.split(";"))}
    diag = {label for label, (_, flags) in libs.items() if "PROBE_SS_NO_" in flags}
    # the rounded decode (PROBE_SS_FAST): its error is printed and recorded, checked only for gross errors (< 3x)
    bound = lambda label: 3.0 if "PROBE_SS_FAST" in libs[label][1] else 1.1  # noqa: E731
    for label, (lib, _) in libs.items():
        if label not in diag:
            print(f"{label}: odd-shape checks: worst error ratio {checks(lib, bound(label)):.3f}", flush=True)
    rows = []
    torch.manual_seed(0)
    for model, layer, n, k, w, q in model_weights():
        if n % ROWS or k % 256 or (shapes and f"{n}x{k}" not in shapes):
            continue
        qs = [q] + [clone_weight(q) for _ in range(rotation_count(q.nbytes()) - 1)]
        ws = [w] + [w.clone() for _ in range(rotation_count(n * k * 2) - 1)]
        for m in ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            prov = {"cublas": [lambda i=i: x @ ws[i].T for i in range(len(ws))],
                    "fastnf4": [lambda i=i: fastnf4.linear(x, qs[i]) for i in range(len(qs))]}
            errs = {}
            for label, (lib, _) in libs.items():
                if label not in diag:
                    y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                    ss_linear(lib, x, q, y, force)
                    errs[label], finite = err_ratio(y, x, q)
                    assert finite and errs[label] <= bound(label), (model, layer, m, label, errs[label])
                prov[label] = [lambda i=i, lib=lib: ss_linear(lib, x, qs[i], splits=force) for i in range(len(qs))]
            tm = time_graphs(prov, per_graph=10, replays=10)
            rows_ = next(iter(libs.values()))[0].rows
            row = dict(model=model, layer=layer, N=n, K=k, M=m, nf4_mb=q.nbytes() / 1e6, plan=plan(m, n, k, force, rows_),
                       **{f"err_{t}": e for t, e in errs.items()},
                       **{f"{name}_us": v["median_us"] for name, v in tm.items()})
            rows.append(row)
            c = row["cublas_us"]
            print(f"{model[:6]:6s} {layer:8s} M {m:3d} {row['nf4_mb']:6.1f} MB plan {row['plan']} | cuBLAS {c:7.1f} | "
                  f"fastnf4 {row['fastnf4_us']:7.1f} ({c / row['fastnf4_us']:.2f}) | "
                  + " ".join(f"{t} {row[f'{t}_us']:6.1f} ({c / row[f'{t}_us']:.2f})" for t in libs), flush=True)
        del qs, ws
        torch.cuda.empty_cache()
    if out:
        json.dump({"env": environment(), "builds": {t: f for t, (_, f) in libs.items()}, "rows": rows}, open(out[0], "w"), indent=1)


if __name__ == "__main__":
    main()
