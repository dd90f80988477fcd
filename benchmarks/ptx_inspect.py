"""Compile a fastnf4 Triton kernel for sm_90 on a machine without a GPU and summarise its PTX: load/store
widths, shared memory, barriers. Arguments get the 16-divisibility the JIT gives aligned pointers and
sizes. usage: python benchmarks/ptx_inspect.py dequant ROWS COLS [WARPS]"""
import collections
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def compile_ptx(fn, signature, constexprs, num_warps=4, **options):
    attrs = {(i,): [["tt.divisibility", 16]] for i, (k, v) in enumerate(signature.items()) if v != "constexpr"}
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, **options})
    return k


def summary(k):
    ptx = k.asm["ptx"]
    ops = collections.Counter(re.findall(r"\b((?:ld|st)\.global[\w.]*)", ptx))
    return {"shared": k.metadata.shared, "bar.sync": ptx.count("bar.sync"), "mem": dict(ops),
            "regs?": re.findall(r"\.reg \.b32 \s*%r<(\d+)>", ptx)}


if __name__ == "__main__":
    from fastnf4.ops.dequantize.kernel import dequantize_4bit_kernel

    rows, cols = int(sys.argv[2]), int(sys.argv[3])
    warps = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    sig = {"p_packed": "*u8", "p_absmax": "*fp32", "p_code": "*fp32", "p_out": "*bf16", "p_ncode": "*fp32",
           "p_nabsmax": "*fp32", "p_offset": "*fp32", "n_bytes": "i32", "numel": "i32", "n_blocks": "i32",
           "trig_from": "i32"}
    const = {"BLOCKSIZE": 64, "NESTED": False, "NESTED_BLOCKSIZE": 256, "ROWS": rows, "COLS": cols, "INT64": False,
             "MANUAL_BF16": False}
    sig.update({k: "constexpr" for k in const})
    k = compile_ptx(dequantize_4bit_kernel, sig, const, warps, enable_fp_fusion=False)
    open("/tmp/dequant.ptx", "w").write(k.asm["ptx"])
    print(summary(k))
