"""One fastnf4 call on cuda:1 while cuda:0 is current, checked bit for bit against the same call with cuda:1 current.
Run each case in its own process (an illegal address ends the CUDA context), with the package to test on PYTHONPATH:
the package before session 33's device guard (`git archive 0089436 fastnf4`) shows the bug, the current one its fix.
usage: python benchmarks/probe_multi_gpu.py quantize | dequantize | M (linear at M rows)"""
import sys

import torch

import fastnf4


def main(case: str) -> None:
    torch.cuda.set_device(0)
    g = torch.Generator(device="cuda:1").manual_seed(0)
    w = torch.randn(8192, 4096, dtype=torch.bfloat16, device="cuda:1", generator=g) * 0.05
    x = None
    try:
        if case == "quantize":
            out = fastnf4.quantize(w).packed
        else:
            with torch.cuda.device(1):
                q = fastnf4.quantize(w)
            torch.cuda.synchronize(1)
            if case == "dequantize":
                out = fastnf4.dequantize(q)
            else:
                x = torch.randn(int(case), 4096, dtype=torch.bfloat16, device="cuda:1", generator=g)
                out = fastnf4.linear(x, q)
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        with torch.cuda.device(1):  # the oracle: the same call with the tensors' GPU current
            ref = (fastnf4.quantize(w).packed if case == "quantize" else
                   fastnf4.dequantize(q) if case == "dequantize" else fastnf4.linear(x, q))
            torch.cuda.synchronize(1)
        print(f"{case}: ran; bitwise equal to the call with cuda:1 current: {torch.equal(out, ref)}")
    except Exception as e:  # what the case raised, one line
        print(f"{case}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")


if __name__ == "__main__":
    main(sys.argv[1])
