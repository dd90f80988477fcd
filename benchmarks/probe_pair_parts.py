"""Where the pair-column decode kernel's time goes (gemv_mma.cu kPair): on a few model weights, the production dispatch
at M = 1-4 against the pair kernels (16 / 20 warps) at M = 1-4 with their default plans and unsplit (no settle), in one
interleaved graph timing per (weight, M); checked first as probe_pair_cols.py does.
usage: python benchmarks/probe_pair_parts.py [JSON]"""
import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.ops.matmul import gemv_mma
from probe_weights import check_and_time, rotated, write_rows

WEIGHTS = [("llama gate_up", 57344, 8192), ("llama q+o", 8192, 8192), ("qwen down", 5120, 25600),
           ("gemma gate+up", 21504, 5376), ("qwen gate+up", 25600, 5120)]


def main():
    rows = []
    torch.manual_seed(0)
    for name, n, k in WEIGHTS:
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
        q = fastnf4.quantize(w, blocksize=64, double_quant=True)
        ws, qs = rotated(w, q)
        wd = fastnf4.dequantize(q)
        for m in (1, 2, 3, 4):
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            runs = {"fastnf4": lambda x, q, y=None: fastnf4.linear(x, q) if y is None else y.copy_(fastnf4.linear(x, q))}
            for v in (7, 8):
                tag = f"pair{16 if v == 7 else 20}"
                runs[tag] = lambda x, q, y=None, v=v: gemv_mma.launch(x, *linear_args(q), y=y, kernel=v)
                runs[tag + " s1"] = (lambda x, q, y=None, v=v:
                                     gemv_mma.launch(x, *linear_args(q), y=y, kernel=v, splits=(1, k // 128)))
            us, errs = check_and_time(x, wd, ws, qs, runs, name)
            rows.append(dict(name=name, N=n, K=k, M=m, us=us, err=errs))
            print(f"{name:14s} M {m} " + " ".join(f"{p}:{v:.1f}" for p, v in us.items()), flush=True)
        del qs, ws, wd
        torch.cuda.empty_cache()
    write_rows(rows)


if __name__ == "__main__":
    main()
