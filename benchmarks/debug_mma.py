import torch, fastnf4
from fastnf4.ops.matmul import gemv_mma
from benchmarks.check_mma import args, correctness
import collections
torch.manual_seed(0)
for n, k, bs, nested in [(17, 96, 4096, True), (17, 96, 4096, False), (17, 96, 64, True), (64, 96, 4096, True)]:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
    q = fastnf4.quantize(w, blocksize=bs, double_quant=nested)
    wd = fastnf4.dequantize(q)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    ref = (x.double() @ wd.double().T)[0]
    y = gemv_mma.launch(x, *args(q))[0]
    torch.cuda.synchronize()
    bad = ((y.double() - ref).abs() > 0.05 * ref.abs().max()).nonzero().flatten().tolist()
    print(n, k, bs, nested, "bad rows", bad, "y", y[bad[:4]].tolist() if bad else "", "ref", ref[bad[:4]].tolist() if bad else "")
c = correctness()
print(c["nfails"], collections.Counter((f[0], f[1], f[2], f[3], f[5]) for f in c["fails"] if f[7] / f[8] > 2.5))
