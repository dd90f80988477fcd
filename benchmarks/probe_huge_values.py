"""Finite values near the float32 limit (block absmax >= 2^126, FLT_MAX, an absmax sum past FLT_MAX): fastnf4's
quantize / dequantize and the pure-PyTorch reference against bitsandbytes' CUDA kernels, one line per case (session 47;
tests/gpu/test_bnb_exact.py::test_huge_finite_values asserts the same). Run on a GPU with bitsandbytes installed."""
import torch, fastnf4, sys
import bitsandbytes.functional as F
from fastnf4.ops.quantize import naive
def bits(t): return t.reshape(-1).view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])
g = torch.Generator(device="cuda").manual_seed(126)
big = torch.finfo(torch.float32).max
for quant_type in ("nf4",):
  for dt in (torch.float32, torch.bfloat16):
    for overflow in (False, True):
        w = torch.randn(64 * 48, device="cuda", generator=g)
        w[0:64] *= 2.0**125
        w[64:128] *= 3e37
        w[128:192] = torch.linspace(-1.0, 1.0, 64, device="cuda") * 3.0e38
        w[192] = big if dt == torch.float32 else 3.3e38
        if overflow: w[256:1024] = w[256:1024].clamp(-3.0, 3.0) * 1e38
        w = w.to(dt)
        for bs in (64, 256):
            for nested in (False, True):
                packed, qs = F.quantize_4bit(w, blocksize=bs, compress_statistics=nested, quant_type=quant_type)
                q = fastnf4.quantize(w, blocksize=bs, double_quant=nested, quant_type=quant_type)
                pd = (q.packed_u8 != packed.reshape(-1)).nonzero().flatten()
                ad = (bits(q.absmax) != bits(qs.absmax)).nonzero().flatten()
                msg = f"{dt} ov={overflow} bs={bs} nested={nested}: packed diff {pd.numel()} at {pd[:6].tolist()} absmax diff {ad.numel()} at {ad[:4].tolist()}"
                if pd.numel(): 
                    i = pd[0].item(); msg += f" | ours {q.packed_u8[i].item():02x} bnb {packed.reshape(-1)[i].item():02x} w {w.reshape(-1)[2*i:2*i+2].tolist()} absmax_bnb {qs.absmax[(2*i)//bs].item() if not nested else None}"
                if ad.numel():
                    i = ad[0].item(); msg += f" | absmax ours {q.absmax[i].item()} bnb {qs.absmax[i].item()}"
                if nested:
                    msg += f" | offset ours {q.offset.item()} bnb {qs.offset.item()} nab {(bits(q.nested_absmax)!=bits(qs.state2.absmax)).sum().item()}"
                else:
                    p, a = naive.quantize_4bit(w.reshape(-1), bs, quant_type)
                    msg += f" | naive packed diff {(p != packed.reshape(-1)).sum().item()} absmax {(bits(a)!=bits(qs.absmax)).sum().item()}"
                # dequant
                qs.dtype = dt
                e = F.dequantize_4bit(packed, qs); r = fastnf4.dequantize(fastnf4.NF4Weight.from_bnb(packed, qs), dtype=dt)
                dd = (bits(e) != bits(r)).nonzero().flatten()
                msg += f" | dequant diff {dd.numel()}"
                if dd.numel(): i = dd[0].item(); msg += f" at {i}: ours {r.reshape(-1)[i].item()} bnb {e.reshape(-1)[i].item()}"
                print(msg)
