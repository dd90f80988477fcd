"""``fastnf4 bench paper``: the design space of "Fast NF4 Dequantization Kernels for Large Language Model
Inference" (Qi, Jiang, Annavaram, arXiv 2604.02556) measured side by side on the GPU at hand.

CUDA variants in ``nf4_variants.cu`` (built here with nvcc on first use, loaded with ctypes; a study, not a
fastnf4 backend): tree decode, global-memory table, shared-memory table (the paper), shared pair table.
Each is checked bit-exact against bitsandbytes (or fastnf4's reference) before it is timed beside
bitsandbytes' ``dequantize_4bit`` and fastnf4's Triton kernel; static SASS instruction counts come from
cuobjdump. The paper's A100 figures are printed beside the H200 measurements.
"""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import tempfile

import torch

VARIANTS = {0: "tree decode (bnb <= 0.47)", 1: "global-memory table (bnb >= 0.48)",
            2: "shared-memory table (paper)", 3: "shared-memory pair table (256 x 2 floats)"}
SOURCE = os.path.join(os.path.dirname(__file__), "nf4_variants.cu")
PAPER_A100 = {
    "kernel speedup of the shared-memory table over bitsandbytes": "2.0-2.2x (Gemma-3-27B, Qwen3-32B, Llama-3.3-70B)",
    "instruction count": "-71%",
    "table traffic per thread block": "64x less",
    "end-to-end speedup": "up to 1.54x",
    "dequantization share of end-to-end latency": "up to 40% (Qwen3-32B, GSM8K, small batch), falling with batch",
}


def build(arch: str | None = None, out_dir: str | None = None) -> str:
    """Compile ``nf4_variants.cu`` to a shared library (cached by source hash and arch); returns its path."""
    from fastnf4 import _cuda

    if shutil.which("nvcc") is None:
        raise RuntimeError("the paper study needs nvcc to build its CUDA variants")
    if arch is None:
        arch = _cuda.device_arch(torch.cuda.current_device())
    return _cuda.compile_source(SOURCE, arch, out_dir or os.path.join(tempfile.gettempdir(), "fastnf4-study"))


class Variants:
    def __init__(self, lib_path: str):
        self.path = lib_path
        self.lib = ctypes.CDLL(lib_path)
        f = self.lib.nf4_study_dequant
        f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int,
                      ctypes.c_void_p]
        f.restype = ctypes.c_int

    def dequant(self, variant: int, packed: torch.Tensor, absmax: torch.Tensor, blocksize: int, out: torch.Tensor):
        if not (packed.is_cuda and packed.dtype == torch.uint8 and absmax.dtype == torch.float32
                and out.dtype == torch.bfloat16 and out.is_contiguous() and packed.is_contiguous()):
            raise ValueError("study kernels take contiguous CUDA uint8 packed, float32 absmax and a bf16 out")
        if packed.numel() != (out.numel() + 1) // 2 or absmax.numel() != -(-out.numel() // blocksize):
            raise ValueError("packed/absmax sizes do not match out")
        rc = self.lib.nf4_study_dequant(variant, packed.data_ptr(), absmax.data_ptr(), out.data_ptr(), out.numel(),
                                        blocksize, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if rc != 0:
            raise RuntimeError(f"study kernel {variant} failed to launch (code {rc})")
        return out

    def sass_counts(self) -> dict[int, int]:
        """Static SASS instruction count of each variant's kernel (cuobjdump)."""
        exe = shutil.which("cuobjdump")
        if exe is None:
            return {}
        text = subprocess.run([exe, "-sass", self.path], capture_output=True, text=True, check=True).stdout
        counts: dict[int, int] = {}
        for block in text.split("Function : ")[1:]:
            m = re.match(r"_Z11nf4_dequantILi(\d)EE", block)
            if m:
                counts[int(m.group(1))] = len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+\S", block, flags=re.M))
        return counts
