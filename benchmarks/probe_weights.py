"""The model weights the matmul probes run on (shared by probe_wgmma_build / _tail / _splits), and the check-then-time
step of the probes that compare kernel variants (probe_small_m_plans / probe_wgmma_bm8 / probe_wgmma_wide_tail)."""
import json
import sys

import torch

import fastnf4
from fastnf4.bench.common import clone_weight
from fastnf4.bench.harness import environment, model_shapes, rotation_count, time_graphs


def model_weights(min_packed_bytes: float = 8e6):
    """Each distinct (N, K) linear weight of the three models whose packed NF4 weight has at least
    ``min_packed_bytes``: yields (model, layer, n, k, w, q), w a fresh random bf16 weight on the GPU (std 0.02, drawn
    when the weight's turn comes, so the caller's own draws in between keep their order) and q its NF4 (blocksize 64,
    double quantization)."""
    seen = set()
    for model, layer, n, k in model_shapes():
        if (n, k) in seen or n * k // 2 < min_packed_bytes:
            continue
        seen.add((n, k))
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
        yield model, layer, n, k, w, fastnf4.quantize(w, blocksize=64, double_quant=True)


def rotated(w, q):
    """Copies of the bf16 weight and of its NF4 form, enough of each to rotate past the L2 (harness.rotation_count)."""
    n, k = w.shape
    return ([w] + [w.clone() for _ in range(rotation_count(n * k * 2) - 1)],
            [q] + [clone_weight(q) for _ in range(rotation_count(q.nbytes()) - 1)])


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


def write_rows(rows):
    """``rows`` with the environment as JSON to the command line's argument ending in .json, if there is one."""
    out = [a for a in sys.argv[1:] if a.endswith(".json")]
    if out:
        json.dump({"env": environment(), "rows": rows}, open(out[0], "w"), indent=1)
