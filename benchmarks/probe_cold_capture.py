"""What a first call of an op inside a CUDA-graph capture does (no call of it on that device before): each case in a
fresh process (a failure may leave the CUDA context broken). Prints one line per case: "ok" with the replay bitwise
equal to an eager call made after, or the exception. Session 47; run on a GPU."""
import subprocess
import sys

CASE = r"""
import sys, torch, fastnf4
case, m = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
q = fastnf4.quantize(w)            # quantize has run on this device, nothing else
x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
out = torch.empty(4096 * 4096, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g):
        y = fastnf4.linear(x, q) if case == "linear" else fastnf4.dequantize(q, out=out)
    g.replay()
    torch.cuda.synchronize()
    ref = fastnf4.linear(x, q) if case == "linear" else fastnf4.dequantize(q)
    same = torch.equal(y.view(torch.int16), ref.reshape(y.shape).view(torch.int16))
    exact = (x.double() @ fastnf4.dequantize(q).double().T) if case == "linear" else ref.double()
    rel = lambda t: ((t.double().reshape(exact.shape) - exact).norm() / exact.norm()).item()  # noqa: E731
    print(f"{case} M={m}: ok, replay bitwise equal to eager: {same} (error vs float64: replay {rel(y):.2e}, "
          f"eager {rel(ref):.2e})")
except Exception as e:
    print(f"{case} M={m}: {type(e).__name__}: " + " / ".join(str(e).split(chr(10)))[:400])
"""

CASES = [("dequantize", 0), ("linear", 1), ("linear", 2), ("linear", 8), ("linear", 64), ("linear", 700)]
for case, m in [c for c in CASES if len(sys.argv) < 2 or str(c[1]) in sys.argv[1:]]:
    r = subprocess.run([sys.executable, "-c", CASE, case, str(m)], capture_output=True, text=True, timeout=300)
    out = [ln for ln in r.stdout.splitlines() if ln.strip()]
    warns = sorted({ln.strip() for ln in r.stderr.splitlines() if "Warning" in ln})
    errs = [ln.strip() for ln in r.stderr.splitlines() if "Error" in ln or "error" in ln]
    print(out[-1] if out else f"{case} M={m}: no result (rc {r.returncode}): {' | '.join(errs[-3:])[:600]}")
    for ln in warns:
        print("   ", ln[:300])
