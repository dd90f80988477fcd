"""Build-on-first-use for fastnf4's CUDA sources (nvcc -> shared library -> ctypes).

fastnf4 is Triton first; a kernel lives in CUDA only where Triton cannot express what pays (the decode-size
tensor-core matmul needs a per-lane shared-memory table and hand-placed ``mma.sync`` fragments). Such a
source is compiled once per (source hash, GPU architecture) with the ``nvcc`` on PATH into
``$FASTNF4_CACHE`` (default ``~/.cache/fastnf4``) and loaded with ctypes; it uses no PyTorch headers, so the
build takes seconds and does not depend on the torch version. Without nvcc, or with ``FASTNF4_CUDA=0``,
callers fall back to the Triton kernels.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import warnings

import torch

_lock = threading.Lock()


def cache_dir() -> str:
    return os.environ.get("FASTNF4_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "fastnf4")


def enabled() -> bool:
    return os.environ.get("FASTNF4_CUDA", "1") != "0" and shutil.which("nvcc") is not None


_LOCAL_INCLUDE = re.compile(rb'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def _source_bytes(source: str, seen: set[str] | None = None) -> bytes:
    """The text of ``source`` followed by that of every header it includes with quotes from its own folder (and
    theirs), so that a change in such a header changes the cache key; a source without them hashes as itself."""
    seen = set() if seen is None else seen
    seen.add(os.path.abspath(source))
    with open(source, "rb") as f:
        text = f.read()
    for name in _LOCAL_INCLUDE.findall(text):
        header = os.path.join(os.path.dirname(os.path.abspath(source)), name.decode())
        if os.path.isfile(header) and os.path.abspath(header) not in seen:
            text += _source_bytes(header, seen)
    return text


def compile_source(source: str, arch: str, out_dir: str | None = None, extra: tuple[str, ...] = ()) -> str:
    """Compile ``source`` for ``arch`` (e.g. ``sm_90``) into a shared library; cached by content hash (the source
    and the local headers it includes)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise RuntimeError("nvcc is not on PATH")
    text = _source_bytes(source)
    tag = hashlib.sha256(text + arch.encode() + " ".join(extra).encode()).hexdigest()[:16]
    out_dir = out_dir or cache_dir()
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(source))[0]
    lib = os.path.join(out_dir, f"lib{stem}-{arch}-{tag}.so")
    if os.path.exists(lib):
        return lib
    number = arch.split("_")[1]
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        cmd = [nvcc, f"-gencode=arch=compute_{number},code=sm_{number}", "-O3", "-std=c++17", "-Xcompiler", "-fPIC",
               "--shared", *extra, "-o", tmp, source]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"nvcc failed on {source}:\n{res.stderr[-4000:]}")
        os.replace(tmp, lib)  # atomic: concurrent builders never see a half-written library
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


def device_arch(index: int) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


@functools.cache
def _load(source: str, arch: str) -> ctypes.CDLL | None:
    extra = tuple(os.environ.get("FASTNF4_NVCC_FLAGS", "").split())  # experiments (benchmarks/check_mma.py)
    try:
        return ctypes.CDLL(compile_source(source, arch, extra=extra))
    except (RuntimeError, OSError) as e:
        warnings.warn(f"fastnf4: CUDA kernels from {os.path.basename(source)} unavailable ({e}); using Triton",
                      RuntimeWarning, stacklevel=3)
        return None


def load(source: str, device: torch.device, arch_suffix: str = "") -> ctypes.CDLL | None:
    """The compiled library for ``device`` (built on first use), or None when CUDA builds are unavailable.
    ``arch_suffix`` "a" builds for the architecture-specific target (``sm_90a``: wgmma)."""
    if device.type != "cuda" or not enabled():
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _lock:
        return _load(source, device_arch(index) + arch_suffix)
