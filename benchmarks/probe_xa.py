"""Probe of probe_xa.cu (x as the mma A operand, weights as n8 B tiles, no block synchronisation after the start)
against the production ``fastnf4.linear`` and bf16 cuBLAS on the unquantized weight, at M = 8 / 16 / 32 on every
model weight of >= 8 MB (graph timing, providers interleaved: ``harness.time_graphs``). Before timing, each build
and split plan is checked on fresh data with a poisoned output: error against a float64 product with the
dequantized weight, relative to cuBLAS's error on the same weight (the kernel multiplies by exactly the dequantized
weight, so ~1), plus odd shapes (N, M off the tiles, K % 128 != 0, bias, fp16, blocksizes, nested off).
Builds: ``--builds "label:nvcc flags;label:flags"`` (PROBE_XA_T tiles per warp, PROBE_XA_U super-steps of weights in
registers, PROBE_XA_MINB blocks per SM for the launch bounds).
usage: python benchmarks/probe_xa.py [--builds "t4:-DPROBE_XA_T=4;..."] [--m 8,16,32] [JSON]"""
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


class Params(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in ("packed", "absmax", "nested_code", "nested_absmax", "offset",
                                                       "code", "x", "bias", "y", "y32")] + \
               [(name, ctypes.c_longlong) for name in ("M", "N", "K", "log2_blocksize", "splits", "per")]


class Build:
    def __init__(self, label: str, flags: str):
        self.label, self.flags = label, flags
        self.lib = ctypes.CDLL(_cuda.compile_source(os.path.join(HERE, "probe_xa.cu"), _cuda.device_arch(0),
                                                    extra=tuple(flags.split())))
        self.lib.probe_xa_run.argtypes = [ctypes.POINTER(Params), ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                          ctypes.c_void_p]
        assert self.lib.probe_xa_params_size() == ctypes.sizeof(Params)
        assert self.lib.probe_xa_prepare() == 0
        self.tiles = self.lib.probe_xa_tiles()
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.warps_resident = sms * self.lib.probe_xa_minb() * 8


def plan(n: int, k: int, tiles: int, warps_resident: int, splits: int | None = None) -> tuple[int, int]:
    """(S, super-steps per split): about one wave of warps, at least 2 super-steps each."""
    groups = -(-n // (8 * tiles))
    ss = -(-k // 128)
    want = splits or max(1, min(ss // 2, round(warps_resident / groups)))
    per = -(-ss // want)
    return -(-ss // per), per


def xa_linear(b: Build, x, q, bias=None, y=None, splits=None):
    m, k = x.shape
    n = q.shape[0]
    nested = q.nested_code is not None
    tiles = b.tiles
    s, per = plan(n, k, tiles, b.warps_resident, splits)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device) if y is None else y
    y32 = torch.empty(s, m, n, dtype=torch.float32, device=x.device) if s > 1 else None
    code = fastnf4.codebooks.kernel_code(q.quant_type, q.device)
    p = Params(packed=q.packed_u8.data_ptr(), absmax=q.absmax.data_ptr(),
               nested_code=q.nested_code.data_ptr() if nested else None,
               nested_absmax=q.nested_absmax.data_ptr() if nested else None,
               offset=q.offset.data_ptr() if nested else None, code=code.data_ptr(), x=x.data_ptr(),
               bias=bias.data_ptr() if bias is not None else None, y=y.data_ptr(),
               y32=y32.data_ptr() if y32 is not None else None, M=m, N=n, K=k,
               log2_blocksize=q.blocksize.bit_length() - 1, splits=s, per=per)
    groups = -(-n // (8 * tiles))
    blocks = -(-groups * s // 8)
    rc = b.lib.probe_xa_run(ctypes.byref(p), 0 if x.dtype == torch.bfloat16 else 1, int(nested), blocks,
                          torch.cuda.current_stream().cuda_stream)
    assert rc == 0, rc
    return y


def err_ratio(y, x, q, bias=None):
    wd = fastnf4.dequantize(q, x.dtype)
    ref = x.double() @ wd.double().T + (bias.double() if bias is not None else 0)
    rel = lambda t: ((t.double() - ref).norm() / ref.norm()).item()  # noqa: E731
    return rel(y) / rel(torch.nn.functional.linear(x, wd, bias)), bool(torch.isfinite(y).all())


def checks(b: Build):
    worst = 0.0
    torch.manual_seed(1)
    cases = [(300, 1536, 64, True, torch.bfloat16), (1000, 576, 256, False, torch.float16),
             (203, 4096, 4096, True, torch.bfloat16), (4096, 160, 64, False, torch.bfloat16),
             (777, 2080, 128, True, torch.float16)]
    for n, k, bs, nested, dt in cases:
        q = fastnf4.quantize(torch.randn(n, k, device="cuda", dtype=dt) * 0.05, blocksize=bs, double_quant=nested)
        for m in (3, 8, 13, 16, 17, 32):
            for splits in (None, 1, 3):
                x = torch.randn(m, k, device="cuda", dtype=dt)
                bias = torch.randn(n, device="cuda", dtype=dt) if m % 2 else None
                y = torch.full((m, n), float("nan"), device="cuda", dtype=dt)
                xa_linear(b, x, q, bias, y, splits)
                r, finite = err_ratio(y, x, q, bias)
                assert finite and r <= 1.1, (n, k, bs, nested, dt, m, splits, r)
                worst = max(worst, r)
    return worst


def main():
    argv = sys.argv[1:]
    spec = argv[argv.index("--builds") + 1] if "--builds" in argv else "t4:-DPROBE_XA_T=4"
    ms = [int(v) for v in argv[argv.index("--m") + 1].split(",")] if "--m" in argv else [8, 16, 32]
    out = [a for a in argv if a.endswith(".json")]
    libs = {}
    for part in spec.split(";"):
        label, flags = part.split(":", 1)
        libs[label] = Build(label, flags)
    for t, b in libs.items():
        print(f"{t} ({b.flags}): odd-shape checks worst error ratio {checks(b):.3f}", flush=True)
    rows = []
    torch.manual_seed(0)
    for model, layer, n, k, w, q in model_weights():
        qs = [q] + [clone_weight(q) for _ in range(rotation_count(q.nbytes()) - 1)]
        ws = [w] + [w.clone() for _ in range(rotation_count(n * k * 2) - 1)]
        for m in ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            prov = {"cublas": [lambda i=i: x @ ws[i].T for i in range(len(ws))],
                    "fastnf4": [lambda i=i: fastnf4.linear(x, qs[i]) for i in range(len(qs))]}
            errs = {}
            for t, b in libs.items():
                y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                xa_linear(b, x, q, y=y)
                errs[t], finite = err_ratio(y, x, q)
                assert finite and errs[t] <= 1.1, (model, layer, m, t, errs[t])
                prov[t] = [lambda i=i, b=b: xa_linear(b, x, qs[i]) for i in range(len(qs))]
            tm = time_graphs(prov, per_graph=20, replays=10)
            row = dict(model=model, layer=layer, N=n, K=k, M=m, nf4_mb=q.nbytes() / 1e6,
                       **{f"{name}_us": v["median_us"] for name, v in tm.items()},
                       **{f"err_{t}": e for t, e in errs.items()},
                       **{f"plan_{t}": plan(n, k, b.tiles, b.warps_resident) for t, b in libs.items()})
            rows.append(row)
            c = row["cublas_us"]
            print(f"{model[:6]:6s} {layer:8s} M {m:2d} {row['nf4_mb']:6.1f} MB | cuBLAS {c:7.1f} | fastnf4 "
                  f"{row['fastnf4_us']:7.1f} ({c / row['fastnf4_us']:.2f}) | "
                  + " ".join(f"{t} {row[f'{t}_us']:6.1f} ({c / row[f'{t}_us']:.2f})" for t in libs), flush=True)
        del qs, ws
        torch.cuda.empty_cache()
    if out:
        json.dump({"env": environment(), "builds": {t: b.flags for t, b in libs.items()}, "rows": rows},
                  open(out[0], "w"), indent=1)


if __name__ == "__main__":
    main()
