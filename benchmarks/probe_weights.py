"""The model weights the matmul probes run on (shared by probe_wgmma_build / _tail / _splits), and the check-then-time
step of the probes that compare kernel variants (probe_small_m_plans / probe_wgmma_bm8 / probe_wgmma_wide_tail)."""
import json
import os
import sys

import torch

import fastnf4
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import environment, model_shapes, rotation_count, time_graphs


def model_weights(min_packed_bytes: float = 8e6, only: set | None = None):
    """Each distinct (N, K) linear weight of the three models whose packed NF4 weight has at least
    ``min_packed_bytes``: yields (model, layer, n, k, w, q), w a fresh random bf16 weight on the GPU (std 0.02, drawn
    when the weight's turn comes, so the caller's own draws in between keep their order) and q its NF4 (blocksize 64,
    double quantization). ``only``: the (model, layer) pairs to yield; the others are still drawn (and quantized), so
    the yielded weights are the ones a full walk gives."""
    seen = set()
    for model, layer, n, k in model_shapes():
        if (n, k) in seen or n * k // 2 < min_packed_bytes:
            continue
        seen.add((n, k))
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
        q = fastnf4.quantize(w, blocksize=64, double_quant=True)
        if only is None or (model, layer) in only:
            yield model, layer, n, k, w, q


def rotated(w, q):
    """Copies of the bf16 weight and of its NF4 form, enough of each to rotate past the L2 (harness.rotation_count)."""
    n, k = w.shape
    return ([w] + [w.clone() for _ in range(rotation_count(n * k * 2) - 1)],
            [q] + [clone_weight(q) for _ in range(rotation_count(q.nbytes()) - 1)])


def probe_launcher(fn, what: str):
    """``launcher(cfg)`` -> run(x, q, b=None, y=None) for a probe library's entry ``fn(Params*, dtype, nested, cfg,
    stream)`` (probe_burst.cu, probe_burst16.cu): the weight's tensors and x / bias / y in gemv_mma's Params, y
    allocated when not given; a nonzero return raises, naming ``what`` and the cfg."""
    import ctypes

    from fastnf4.ops.matmul.gemv_mma import Params

    fn.argtypes = [ctypes.POINTER(Params), ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    fn.restype = ctypes.c_int

    def launcher(cfg):
        def run(x, q, b=None, y=None):
            m, k = x.shape
            n = q.shape[0]
            if y is None:
                y = torch.empty(m, n, dtype=x.dtype, device=x.device)
            nested = q.nested_absmax is not None
            p = Params(packed=q.packed.data_ptr(), absmax=q.absmax.data_ptr(),
                       nested_code=q.nested_code.data_ptr() if nested else None,
                       nested_absmax=q.nested_absmax.data_ptr() if nested else None,
                       offset=q.offset.data_ptr() if nested else None, x=x.data_ptr(),
                       bias=b.data_ptr() if b is not None else None, y=y.data_ptr(), M=m, N=n, K=k,
                       blocksize=q.blocksize, splits=1, slices_per_split=k // 128, code=q.code.data_ptr())
            rc = fn(ctypes.byref(p), 0 if x.dtype == torch.bfloat16 else 1, int(nested), cfg,
                    torch.cuda.current_stream().cuda_stream)
            if rc != 0:
                raise RuntimeError(f"{what} cfg {cfg}: error {rc}")
            return y
        return run
    return launcher


def production(x, q, y=None):
    """fastnf4.linear (the dispatcher's own pick), into ``y`` when given."""
    out = fastnf4.linear(x, q)
    return out if y is None else y.copy_(out)


def error_ratio(launch, m, n, k, blocksize, nested, bias, dtype):
    """A fresh random weight (std 0.02, NF4 of ``blocksize``, double quant ``nested``), x [m, k] and (``bias``) a bias
    in ``dtype``; ``launch(x, q, b, y)`` writes y (poisoned with NaN first). Returns (its relative Frobenius error
    against a float64 product with the dequantized weight, divided by cuBLAS's on that weight; whether y is finite)."""
    w = torch.randn(n, k, dtype=dtype, device="cuda") * 0.02
    q = fastnf4.quantize(w, blocksize=blocksize, double_quant=nested)
    wd = fastnf4.dequantize(q, dtype)
    x = torch.randn(m, k, dtype=dtype, device="cuda")
    b = torch.randn(n, dtype=dtype, device="cuda") if bias else None
    ref = x.double() @ wd.double().T + (b.double() if bias else 0)
    y = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
    launch(x, q, b, y)
    torch.cuda.synchronize()
    rel = lambda t: ((t.double() - ref).norm() / ref.norm()).item()  # noqa: E731
    return rel(y) / rel(torch.nn.functional.linear(x, wd, b)), bool(torch.isfinite(y).all())


def check_and_time(x, wd, ws, qs, runs, what):
    """Each of ``runs`` (name -> run(x, q, y=None)) first checked on x with a NaN-poisoned output: its error against a
    float64 product with the dequantized weight ``wd`` within 2x that of cuBLAS on ``wd`` (the issue's budget for the
    rounded-code kernels); then all of them and bf16 cuBLAS on the unquantized weights ``ws`` timed in one interleaved
    graph timing, rotating over ``qs``. Returns ({name: median us}, {name: error ratio})."""
    m, n = x.shape[0], wd.shape[0]
    ref = x.double() @ wd.double().T
    rel = lambda t: ((t.double() - ref).norm() / ref.norm()).item()  # noqa: E731
    base = rel(x @ wd.T)
    prov = {"cublas": [lambda i=i: x @ ws[i].T for i in range(len(ws))]}
    errs = {}
    for name, run in runs.items():
        y = torch.full((m, n), float("nan"), dtype=x.dtype, device=x.device)
        run(x, qs[0], y)
        errs[name] = rel(y) / base
        assert torch.isfinite(y).all() and errs[name] <= 2.0, (what, m, name, errs[name])
        prov[name] = [lambda i=i, run=run: run(x, qs[i]) for i in range(len(qs))]
    t = time_graphs(prov, per_graph=20, replays=10)
    return {p: r["median_us"] for p, r in t.items()}, errs


def append_rows(rows):
    """``rows`` appended to the JSON list in the file after ``--json`` on the command line, if given (created if
    missing; a file several probe runs, e.g. the builds of an A / B, add to)."""
    if "--json" in sys.argv:
        path = sys.argv[sys.argv.index("--json") + 1]
        old = json.load(open(path)) if os.path.exists(path) else []
        json.dump(old + rows, open(path, "w"), indent=1)


def write_rows(rows):
    """``rows`` with the environment as JSON to the command line's argument ending in .json, if there is one."""
    out = [a for a in sys.argv[1:] if a.endswith(".json")]
    if out:
        json.dump({"env": environment(), "rows": rows}, open(out[0], "w"), indent=1)
