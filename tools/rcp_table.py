"""Measure where the GPU's ``rcp.approx.ftz.f32`` differs from the correctly rounded reciprocal.

For normal inputs whose reciprocal is normal, the result's mantissa depends only on the input's 23-bit
mantissa, so all 2**23 mantissas of [1, 2) cover every case. Writes the mantissas where the two differ and
the difference in ulps to ``<dir>/rcp_approx_exceptions.safetensors`` (fastnf4/ops/quantize/ ships it), then
checks the emulation against the hardware on random values over the whole exponent range.
usage: python tools/rcp_table.py OUTDIR
"""
import os
import sys

import torch
import triton
import triton.language as tl
from safetensors.torch import save_file


@triton.jit
def _rcp_kernel(p_x, p_y, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(p_x + o, mask=o < n)
    y = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
    tl.store(p_y + o, y, mask=o < n)


def hw_rcp(x):
    y = torch.empty_like(x)
    _rcp_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y


def _pack(bits):
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)
    return (bits.view(-1, 8).to(torch.uint8) * weights).sum(1).to(torch.uint8)


def main(outdir):
    m = torch.arange(2**23, dtype=torch.int32, device="cuda")
    x = (m | 0x3F800000).view(torch.float32)
    hw = hw_rcp(x).view(torch.int32).long().cpu()
    ieee = (1.0 / x.cpu()).view(torch.int32).long()  # CPU division: correctly rounded
    delta = hw - ieee
    print(f"rcp.approx differs from IEEE on {(delta != 0).sum().item()} of 2**23 mantissas; deltas {delta.unique().tolist()}")
    path = os.path.join(outdir, "rcp_approx_exceptions.safetensors")
    save_file({"differs": _pack(delta != 0), "plus_one": _pack(delta > 0)}, path)
    import fastnf4.ops.quantize.naive as naive

    naive.RCP_TABLE = path  # the emulation below reads the table just measured
    naive._rcp_exceptions.cache_clear()
    r = torch.randint(-(2**31), 2**31 - 1, (1 << 24,), dtype=torch.int64, device="cuda").to(torch.int32).view(torch.float32)
    r = torch.cat([r, torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 3.4028234663852886e38, -3.4028234663852886e38,
                                    1e-39, 1.1754943508222875e-38], device="cuda")])
    r = r[~torch.isnan(r)]
    want = hw_rcp(r).cpu()
    got = naive.rcp_approx_ftz(r.cpu())
    bad = want.view(torch.int32) != got.view(torch.int32)
    exps = ((r.cpu().view(torch.int32) >> 23) & 0xFF)[bad]
    print(f"emulated rcp.approx.ftz vs hardware on {r.numel()} random floats: {bad.sum().item()} differ; "
          f"input exponents of those: {exps.unique(return_counts=True)}")
    rb = r.cpu()[bad][:8]
    print("examples (input, hw, emulated):", list(zip(rb.tolist(), want[bad][:8].tolist(), got[bad][:8].tolist())))


if __name__ == "__main__":
    main(sys.argv[1])
