"""Where is bitsandbytes' own gemv_4bit (its decode op, F.gemv_4bit / torch.ops.bitsandbytes.gemv_4bit) right?
Unpatched bitsandbytes, x of one row, relative Frobenius error against a float64 product with bitsandbytes' own
dequantized weight (cuBLAS's on the same weight printed beside it), two calls compared bit for bit.
usage: PYTHONPATH=<bitsandbytes> python benchmarks/probe_bnb_gemv.py"""
import torch
import bitsandbytes.functional as F

torch.manual_seed(0)
print(f"{'K':>5} {'bs':>5} {'nested':>6} {'err_bnb':>10} {'err_cublas':>10} {'repeat':>7}")
for k in (43, 44, 46, 48, 63, 64, 96, 100, 128, 130, 192, 200, 1000, 1024, 4000, 4096, 4100):
    for bs in (64, 256, 4096):
        for nested in (False, True):
            n = 512
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
            p, qs = F.quantize_4bit(w, blocksize=bs, compress_statistics=nested, quant_type="nf4")
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            wd = F.dequantize_4bit(p, qs)
            ref = x.double() @ wd.double().T
            y = F.gemv_4bit(x, p.t(), state=qs)
            torch.cuda.empty_cache()
            junk = torch.randn(1 << 20, device="cuda")  # (other memory contents before the second call)
            y2 = F.gemv_4bit(x, p.t(), state=qs)
            rel = lambda t: ((t.double() - ref).norm() / ref.norm()).item()
            print(f"{k:5d} {bs:5d} {nested!s:>6} {rel(y):10.2e} {rel(torch.nn.functional.linear(x, wd)):10.2e} "
                  f"{'same' if torch.equal(y, y2) else 'DIFF':>7}")

print("x of several rows (K = 4096, blocksize 64): relative error of each row")
for m in (2, 3):
    k, n = 4096, 512
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
    p, qs = F.quantize_4bit(w, blocksize=64, compress_statistics=False, quant_type="nf4")
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    ref = x.double() @ F.dequantize_4bit(p, qs).double().T
    y = F.gemv_4bit(x, p.t(), state=qs)
    print(f"M = {m}:", " ".join(f"{((y[r].double() - ref[r]).norm() / ref[r].norm()).item():.2e}" for r in range(m)))
