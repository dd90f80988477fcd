"""``fastnf4 doctor`` (also ``python -m fastnf4 doctor``): what a bug report needs, in one command.

It reports the versions (fastnf4, Python, torch and its CUDA, the NVIDIA driver, Triton, bitsandbytes, transformers,
safetensors, peft) and the platform; each visible GPU; for each op (quantize, dequantize, linear at decode sizes
M 1-32 and above) which implementation runs on that GPU (fastnf4's CUDA libraries and where they come from, the
Triton kernels, or the pure-PyTorch reference) and why; the bitsandbytes patch; every ``FASTNF4_*`` environment
variable; and a self-check of each op on a small random weight (on the first GPU, else on the CPU) against the
pure-PyTorch reference (``ops/*/naive.py``): quantize and dequantize bit for bit (their contract), linear within
a relative error bound (``LINEAR_BOUND``). The exit status is 0 when every check passes, 1 when one fails.

Nothing here raises for a missing optional package, a CPU-only machine or a failing op: each part that goes wrong
is reported as such. Python-level prints of the packages it imports go to stderr, so ``--json`` prints only JSON.
Importing bitsandbytes runs its backend entry points, fastnf4's patch among them (unless
``FASTNF4_PATCH_BITSANDBYTES=0``): the doctor imports it to report the patch and says so.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import warnings

OPTIONAL = ("triton", "bitsandbytes", "transformers", "safetensors", "peft")
ENTRY_GROUP = "bitsandbytes.backends"
ENTRY_VALUE = "fastnf4._bnb_entry:autopatch"
RELATED_ENV = ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "BNB_CUDA_VERSION")
BLOCKSIZE = 64
CPU_SHAPE = (64, 256)  # small: the Triton interpreter runs it in seconds
# on a GPU: 21M elements, so that M = 1 / 16 reach the CUDA decode kernels (libgemv_mma) and on sm_90 M = 16 / 128
# the wgmma kernel (ops/matmul/dispatch.py); the reference runs on the GPU too
GPU_SHAPE = (5120, 4096)
LINEAR_MS = (1, 16, 128)
# linear: relative Frobenius error against a float64 product with the reference-dequantized weight of at most
# FACTOR times that of torch's own matmul on the same weight and dtype, plus FLOOR (the bound of tests/gpu/ops/
# matmul/test_fuzz_linear.py)
LINEAR_FACTOR = 2.0
LINEAR_FLOOR = 2.0 ** -12
LINEAR_BOUND = f"relative error <= {LINEAR_FACTOR:g} x torch matmul's on the reference weight + 2^-12"

PATH_NAMES = {
    "mma": "CUDA libgemv_mma (tensor-core decode / GEMM kernel)",
    "wgmma": "CUDA libwgmma (Hopper wgmma kernel)",
    "gemv": "Triton GEMV",
    "gemm": "Triton GEMM",
    "dequant+matmul": "Triton dequantize + torch matmul",
    "reference": "pure-PyTorch reference (dequantize + torch matmul)",
}


def _err(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text if len(text) <= 400 else text[:397] + "..."


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except Exception:  # noqa: BLE001  (not installed, or broken metadata)
        return None


def _import(name: str):
    """(module, None) or (None, why it could not be imported)."""
    try:
        return importlib.import_module(name), None
    except Exception as e:  # noqa: BLE001  (any failure of an optional package's import is reported, not raised)
        return None, _err(e)


def _section(fn, *args):
    """``fn(*args)``, or ``{"error": ...}`` if it raised: one broken part never hides the others."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001
        return {"error": _err(e)}


# --- versions and platform ----------------------------------------------------------------------------------------

def _driver(torch) -> dict:
    """The NVIDIA driver: its version (nvidia-smi, else /proc/driver/nvidia/version) and the CUDA version it supports
    (cuDriverGetVersion through libcuda); None where unknown, with why."""
    out: dict = {"version": None, "version_from": None, "cuda": None, "notes": []}
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            r = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=20)
            if r.returncode == 0 and r.stdout.strip():
                out["version"], out["version_from"] = r.stdout.split()[0], "nvidia-smi"
            else:
                out["notes"].append(f"nvidia-smi failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()[:200]}")
        except (OSError, subprocess.SubprocessError) as e:
            out["notes"].append(f"nvidia-smi failed ({_err(e)})")
    else:
        out["notes"].append("no nvidia-smi on PATH")
    if out["version"] is None:
        try:
            with open("/proc/driver/nvidia/version") as f:
                words = f.readline().split()
            for i, word in enumerate(words[:-1]):
                if word == "Module":
                    out["version"], out["version_from"] = words[i + 1], "/proc/driver/nvidia/version"
                    break
        except OSError:
            out["notes"].append("no /proc/driver/nvidia/version")
    try:
        from . import _cuda

        v = _cuda._driver_cuda_version()
        if v:
            out["cuda"] = f"{v // 1000}.{v % 1000 // 10}"
        else:
            out["notes"].append("libcuda.so.1 not loadable: no NVIDIA driver for this process")
    except Exception as e:  # noqa: BLE001
        out["notes"].append(f"driver CUDA version unknown ({_err(e)})")
    return out


def versions(state: dict) -> dict:
    import fastnf4

    out: dict = {
        "fastnf4": {"version": fastnf4.__version__, "path": os.path.dirname(os.path.abspath(fastnf4.__file__)),
                    "distribution": _dist_version("fastnf4")},
        "python": {"version": sys.version.split()[0], "implementation": platform.python_implementation(),
                   "executable": sys.executable},
    }
    torch = state.get("torch")
    if torch is None:
        out["torch"] = {"version": _dist_version("torch"), "error": state.get("torch_error")}
    else:
        out["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                        "hip": getattr(torch.version, "hip", None), "cuda_available": bool(torch.cuda.is_available()),
                        "path": os.path.dirname(torch.__file__)}
        out["driver"] = _section(_driver, torch)
    packages = {}
    for name in OPTIONAL:
        rec: dict = {"installed": _dist_version(name)}
        if name in state.get("imports", {}):  # imported by the doctor: whether it works matters to fastnf4
            module, error = state["imports"][name]
            rec["imported"] = module is not None
            if module is not None:
                rec["version"] = getattr(module, "__version__", None)
            else:
                rec["error"] = error
        else:  # not imported (peft's import takes seconds and imports bitsandbytes): found or not
            try:
                rec["found"] = importlib.util.find_spec(name) is not None
            except (ImportError, ValueError) as e:
                rec["found"], rec["error"] = False, _err(e)
        packages[name] = rec
    out["packages"] = packages
    return out


def platform_info() -> dict:
    libc = platform.libc_ver()
    return {"platform": platform.platform(), "system": platform.system(), "machine": platform.machine(),
            "libc": " ".join(p for p in libc if p) or None, "cpus": os.cpu_count()}


# --- GPUs and implementations -------------------------------------------------------------------------------------

def gpus(torch) -> dict:
    if not torch.cuda.is_available():
        if torch.version.cuda is None and not getattr(torch.version, "hip", None):
            why = f"torch {torch.__version__} is a CPU-only build"
        else:
            why = (f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device (driver missing or too "
                   f"old, or CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})")
        return {"count": 0, "devices": [], "why_none": why}
    devices = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devices.append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                        "arch": f"sm_{p.major}{p.minor}", "memory_gib": round(p.total_memory / 2**30, 1),
                        "sms": p.multi_processor_count})
    return {"count": len(devices), "devices": devices}


def _triton_state(torch, device) -> dict:
    """Whether fastnf4's Triton kernels run for tensors on ``device`` (``_triton.use_triton``), and why not."""
    from . import _triton

    usable = _triton.use_triton(device)
    interp = _triton.interpreter_enabled()
    why = None
    if not _triton.triton_importable():
        why = "Triton is not importable"
    elif device.type == "cuda":
        cc = torch.cuda.get_device_capability(device)
        if interp:
            why = "TRITON_INTERPRET=1: the interpreter runs on host memory only, so CUDA tensors take the reference"
        elif cc < (8, 0):
            why = f"compute capability {cc[0]}.{cc[1]} is below 8.0 (fastnf4's Triton kernels need Ampere or newer)"
    elif device.type == "cpu" and not interp:
        why = "CPU tensors run the reference unless TRITON_INTERPRET=1 (Triton's CPU interpreter)"
    mode = None
    if usable:
        mode = "interpreter (TRITON_INTERPRET=1)" if device.type == "cpu" else "compiled for the GPU"
    return {"usable": usable, "mode": mode, "why_not": why}


def _cuda_status(device) -> dict:
    from . import _cuda

    st = _cuda.status(device)
    m, why = _cuda._manifest()
    st["packaged"]["archs"] = (m or {}).get("archs")
    st["packaged"]["files"] = {name: {"file": e.get("file"), "sass": e.get("sass"), "ptx": e.get("ptx")}
                               for name, e in ((m or {}).get("libraries") or {}).items()}
    return st


def _lib_phrase(rec: dict) -> str:
    source = rec.get("source")
    if source in ("packaged", "jit-cache"):
        return f"{source}: {rec.get('path')}"
    if source == "jit-pending":
        return f"not built yet: nvcc builds it on first use into {rec.get('path')}"
    return f"{source}: {rec.get('reason') or '-'}"


def implementations(torch, device) -> dict:
    """For ``device``: the Triton state, the CUDA libraries (``_cuda.status``) and which implementation each op
    takes there."""
    triton = _section(_triton_state, torch, device)
    libs = _section(_cuda_status, device)
    out: dict = {"device": str(device), "triton": triton, "cuda": libs, "ops": {}}
    if not triton.get("usable"):
        ref = {"uses": "pure-PyTorch reference", "why": "fastnf4's Triton kernels are not used here: see Triton"}
        out["ops"] = {"quantize": ref, "dequantize": ref, "linear M 1-32": ref, "linear M > 32": ref}
        return out
    where = "Triton kernel" + (" in the CPU interpreter" if device.type == "cpu" else "")
    out["ops"]["quantize"] = {"uses": where}
    out["ops"]["dequantize"] = {"uses": where}
    lib = (libs.get("libraries") or {}) if isinstance(libs, dict) else {}
    usable = ("packaged", "jit-cache", "jit-pending")
    gemv, wgmma = lib.get("gemv_mma", {}), lib.get("wgmma", {})
    dense = "torch matmul (cuBLAS)" if device.type == "cuda" else "torch matmul"
    triton_small = f"Triton GEMV (M <= 2), Triton GEMM (wide weights), else Triton dequantize + {dense}"
    decode, large = [], []
    if gemv.get("source") in usable:
        decode.append(f"CUDA libgemv_mma ({gemv['source']}) where the shape fits (dispatch.MMA_RULES)")
    if wgmma.get("source") in usable:
        decode.append(f"CUDA libwgmma ({wgmma['source']}) at M 3-32 on large weights (dispatch.WGMMA_RULES)")
        large.append(f"CUDA libwgmma ({wgmma['source']}) at M <= 512 on large weights (dispatch.WGMMA_RULES)")
    decode.append(("else " if decode else "") + triton_small)
    large.append(("else " if large else "") + f"Triton dequantize + {dense}")
    notes = {name: _lib_phrase(rec) for name, rec in lib.items() if rec.get("source") not in usable}
    out["ops"]["linear M 1-32"] = {"uses": "; ".join(decode)}
    out["ops"]["linear M > 32"] = {"uses": "; ".join(large)}
    if notes:
        out["ops"]["linear M 1-32"]["not used"] = notes
    return out


# --- bitsandbytes -------------------------------------------------------------------------------------------------

def bnb_patch(state: dict) -> dict:
    out: dict = {"installed": _dist_version("bitsandbytes"),
                 "FASTNF4_PATCH_BITSANDBYTES": os.environ.get("FASTNF4_PATCH_BITSANDBYTES")}
    try:
        from . import _bnb_entry

        out["auto_patch_enabled"] = _bnb_entry.enabled()
    except Exception as e:  # noqa: BLE001
        out["auto_patch_enabled"] = None
        out["error"] = _err(e)
    eps = []
    try:
        for ep in importlib.metadata.entry_points(group=ENTRY_GROUP):
            dist = getattr(ep, "dist", None)
            eps.append({"name": ep.name, "value": ep.value,
                        "distribution": f"{dist.name} {dist.version}" if dist is not None else None})
    except Exception as e:  # noqa: BLE001
        out["entry_points_error"] = _err(e)
    out["entry_points"] = eps
    out["entry_point_registered"] = any(ep["value"] == ENTRY_VALUE for ep in eps)
    out["imported_before_doctor"] = state.get("bnb_preloaded", False)
    module, error = state.get("imports", {}).get("bitsandbytes", (None, "not imported"))
    out["import"] = "ok" if module is not None else error
    out["note"] = ("importing bitsandbytes runs its backend entry points, so fastnf4's patch is applied at that import "
                   "(CUDA ops) unless FASTNF4_PATCH_BITSANDBYTES=0; the doctor imported it to report this")
    try:
        from .integrations import bitsandbytes as integ

        out["patched"] = integ.is_patched()
        out["patch_mode"] = {f"{op} ({dev})": key for (op, dev), key in sorted(integ.patch_mode().items())}
    except Exception as e:  # noqa: BLE001
        out["patched"], out["patch_error"] = None, _err(e)
    return out


def environment() -> dict:
    return {"FASTNF4": {k: v for k, v in sorted(os.environ.items()) if k.startswith("FASTNF4_")},
            "related": {k: os.environ[k] for k in RELATED_ENV if k in os.environ}}


# --- the self-check -----------------------------------------------------------------------------------------------

def _bits(t):
    import torch

    t = t.reshape(-1)
    if t.dtype == torch.uint8:
        return t
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _diff(name: str, got, want) -> str | None:
    """None when ``got`` has ``want``'s shape, dtype and bits; else what differs."""
    if got is None or want is None:
        return None if got is None and want is None else f"{name}: {got is None and 'missing' or 'unexpected'}"
    if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
        return f"{name}: {got.dtype}{list(got.shape)} instead of {want.dtype}{list(want.shape)}"
    neq = int((_bits(got) != _bits(want)).sum().item())
    return f"{name}: {neq} of {want.numel()} differ" if neq else None


def _rel(y, ref) -> float:
    return ((y.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def _check(op: str, what: str, fn) -> dict:
    """One line of the self-check: ``fn()`` returns (implementation, detail, ok)."""
    start = time.perf_counter()
    try:
        impl, detail, ok = fn()
    except Exception as e:  # noqa: BLE001  (a raising op is a failed check)
        impl, detail, ok = None, f"raised {_err(e)}", False
    return {"op": op, "what": what, "implementation": impl, "result": "PASS" if ok else "FAIL", "detail": detail,
            "seconds": round(time.perf_counter() - start, 3)}


def self_check(torch, device) -> dict:
    """quantize, dequantize (bf16, fp16) and linear (M = 1, 16, 128) of fastnf4's public API on ``device`` against
    the pure-PyTorch reference."""
    from . import _triton, api
    from .codebooks import dynamic_map, kernel_code
    from .ops.dequantize import naive as dq_ref
    from .ops.quantize import naive as q_ref

    triton = _triton.use_triton(device)
    interp = triton and device.type == "cpu"
    if not triton:
        impl = "reference"
        about = "fastnf4 runs the pure-PyTorch reference here: compared with itself, this checks the install, not a kernel"
    else:
        impl = "Triton" + (" (CPU interpreter)" if interp else "")
        about = f"fastnf4 runs its Triton kernels here{' in the CPU interpreter' if interp else ''}"
    # the interpreter cannot run PTX's rcp.approx: its quantize divides, so it is compared with the reference using
    # the same IEEE reciprocal; on a GPU (and in the reference itself) the emulated hardware reciprocal
    recip = q_ref.ieee_reciprocal_ftz if interp else q_ref.rcp_approx_ftz
    n, k = GPU_SHAPE if device.type == "cuda" else CPU_SHAPE
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(n, k, generator=gen) * 0.05).to(torch.bfloat16).to(device)
    bias = (torch.randn(n, generator=gen) * 0.1).to(torch.bfloat16).to(device)
    xs = {m: torch.randn(m, k, generator=gen).to(torch.bfloat16).to(device) for m in LINEAR_MS}
    weight = {}
    lines = []

    def quantize():
        q = api.quantize(w, blocksize=BLOCKSIZE, double_quant=True)
        weight["q"] = q
        packed, absmax = q_ref.quantize_4bit(w.reshape(-1), BLOCKSIZE, "nf4", reciprocal=recip)
        offset = absmax.mean()
        qabs, nested = q_ref.quantize_8bit(absmax, offset, dynamic_map(device), q.nested_blocksize, reciprocal=recip)
        diffs = [d for d in (_diff("packed bytes", q.packed_u8, packed), _diff("absmax codes", q.absmax, qabs),
                             _diff("nested absmax", q.nested_absmax, nested),
                             _diff("offset", q.offset.reshape(1), offset.reshape(1))) if d]
        return impl, "; ".join(diffs) or "bit-exact (packed bytes, absmax codes, nested absmax, offset)", not diffs

    lines.append(_check("quantize", f"nf4, blocksize {BLOCKSIZE}, double quant, bf16 [{n}, {k}]", quantize))
    q = weight.get("q")
    if q is None:  # quantize raised: the other ops get the reference's weight
        q = _reference_weight(torch, w, recip)
        weight["q"] = q

    def ref_dequant(dtype):
        return dq_ref.dequantize(q.packed_u8, q.absmax, kernel_code(q.quant_type, device), q.blocksize, q.numel,
                                 dtype, q.nested_code, q.nested_absmax, q.offset, q.nested_blocksize).view(n, k)

    for dtype in (torch.bfloat16, torch.float16):
        def dequantize(dtype=dtype):
            got = api.dequantize(q, dtype)
            d = _diff("values", got, ref_dequant(dtype))
            return impl, d or "bit-exact", d is None

        lines.append(_check("dequantize", f"to {str(dtype).replace('torch.', '')}", dequantize))

    wd = None
    for m in LINEAR_MS:
        def linear(m=m):
            nonlocal wd
            if wd is None:
                wd = ref_dequant(torch.bfloat16)
            x = xs[m]
            path = _linear_path(torch, x, q, interp) if triton else "reference"
            name = PATH_NAMES.get(path, path) + (" (CPU interpreter)" if interp else "")
            y = api.linear(x, q, bias)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if tuple(y.shape) != (m, n) or y.dtype != x.dtype:
                return name, f"{y.dtype}{list(y.shape)} instead of {x.dtype}[{m}, {n}]", False
            ref = x.double() @ wd.double().T + bias.double()
            err = _rel(y, ref)
            yard = _rel(torch.nn.functional.linear(x, wd, bias), ref)
            bound = LINEAR_FACTOR * yard + LINEAR_FLOOR
            ok = bool(torch.isfinite(y).all().item()) and err <= bound
            return name, f"relative error {err:.2e} (bound {bound:.2e})", ok

        lines.append(_check("linear", f"M = {m}, bf16, bias", linear))
    return {"device": str(device), "weight": [n, k], "implementation": about, "linear_bound": LINEAR_BOUND,
            "checks": lines, "passed": all(c["result"] == "PASS" for c in lines)}


def _reference_weight(torch, w, recip):
    from .codebooks import code_4bit, dynamic_map
    from .format import NF4Weight
    from .ops.quantize import naive as q_ref

    packed, absmax = q_ref.quantize_4bit(w.reshape(-1), BLOCKSIZE, "nf4", reciprocal=recip)
    offset = absmax.mean()
    ncode = dynamic_map(w.device)
    qabs, nested = q_ref.quantize_8bit(absmax, offset, ncode, 256, reciprocal=recip)
    return NF4Weight(packed=packed.view(-1, 1), absmax=qabs, code=code_4bit("nf4", w.device), blocksize=BLOCKSIZE,
                     shape=w.shape, dtype=w.dtype, nested_absmax=nested, nested_code=ncode, offset=offset,
                     nested_blocksize=256)


def _linear_path(torch, x, q, interp: bool) -> str:
    """The path the dispatcher picks for this call (``ops/matmul/dispatch.py``)."""
    from .ops.matmul import dispatch

    n, k = q.shape
    return dispatch.pick_path(x, q.packed_u8, q.blocksize, n, k, q.nested_code is not None, q.nested_blocksize,
                              manual_bf16=interp, absmax=q.absmax)


# --- the report ---------------------------------------------------------------------------------------------------

def collect() -> dict:
    """The whole report as a dict (what ``--json`` prints)."""
    state: dict = {"bnb_preloaded": "bitsandbytes" in sys.modules, "imports": {}}
    report: dict = {}
    caught: list[str] = []
    with warnings.catch_warnings(record=True) as records, contextlib.redirect_stdout(sys.stderr):
        warnings.simplefilter("always")
        torch, state["torch_error"] = _import("torch")
        state["torch"] = torch
        # bitsandbytes first (its import applies the patch), then Triton
        state["imports"]["bitsandbytes"] = _import("bitsandbytes")
        state["imports"]["triton"] = _import("triton")
        report["versions"] = _section(versions, state)
        report["platform"] = _section(platform_info)
        if torch is not None:
            report["gpus"] = _section(gpus, torch)
            devices = [torch.device("cuda", d["index"]) for d in report["gpus"].get("devices", [])] or \
                [torch.device("cpu")]
            report["self_check"] = _section(self_check, torch, devices[0])
            # after the self-check: the libraries it loaded (or built) show as such
            report["implementations"] = [_section(implementations, torch, d) for d in devices]
        report["bitsandbytes"] = _section(bnb_patch, state)
        report["environment"] = _section(environment)
        for r in records:
            if issubclass(r.category, (DeprecationWarning, PendingDeprecationWarning, FutureWarning)):
                continue  # (other packages' API notices: not about this machine)
            text = f"{r.category.__name__}: {r.message}"
            if text not in caught:
                caught.append(text)
    report["warnings"] = caught
    sc = report.get("self_check") or {}
    report["passed"] = torch is not None and bool(sc.get("passed"))
    return report


def _kv(lines: list[str], key: str, value, indent: int = 2) -> None:
    lines.append(f"{' ' * indent}{key + ':':<22} {value}")


def render(report: dict) -> str:
    """The report as text (what ``fastnf4 doctor`` prints)."""
    lines = ["fastnf4 doctor", "", "Versions"]
    v = report.get("versions", {})
    if "error" in v:
        _kv(lines, "error", v["error"])
    else:
        f = v.get("fastnf4", {})
        _kv(lines, "fastnf4", f"{f.get('version')} ({f.get('path')})")
        p = v.get("python", {})
        _kv(lines, "python", f"{p.get('version')} {p.get('implementation')} ({p.get('executable')})")
        t = v.get("torch", {})
        if t.get("error"):
            _kv(lines, "torch", f"{t.get('version') or 'not installed'}, import FAILED: {t['error']}")
        else:
            _kv(lines, "torch", f"{t.get('version')}, CUDA {t.get('cuda') or 'none (CPU build)'}"
                + (f", HIP {t['hip']}" if t.get("hip") else "") + f", cuda available: {t.get('cuda_available')}")
        d = v.get("driver")
        if d is not None:
            if "error" in d:
                _kv(lines, "NVIDIA driver", f"unknown ({d['error']})")
            else:
                ver = f"{d['version']} (from {d['version_from']})" if d.get("version") else "unknown"
                cuda = f", supports CUDA {d['cuda']}" if d.get("cuda") else ""
                notes = f" [{'; '.join(d['notes'])}]" if d.get("notes") and not d.get("version") else ""
                _kv(lines, "NVIDIA driver", ver + cuda + notes)
        for name, rec in v.get("packages", {}).items():
            installed = rec.get("installed")
            if "imported" in rec:
                if rec["imported"]:
                    text = f"{rec.get('version') or installed}"
                else:
                    text = f"{installed or 'not installed'}, import FAILED: {rec.get('error')}"
            else:
                text = installed or ("found (version unknown)" if rec.get("found") else "not installed")
            _kv(lines, name, text)
    pf = report.get("platform", {})
    lines += ["", "Platform"]
    for key in ("platform", "machine", "libc", "cpus", "error"):
        if pf.get(key) is not None:
            _kv(lines, key, pf[key])
    g = report.get("gpus")
    lines += ["", "GPUs"]
    if g is None:
        lines.append("  unknown (torch is not importable)")
    elif "error" in g:
        _kv(lines, "error", g["error"])
    elif not g.get("devices"):
        lines.append(f"  none visible: {g.get('why_none')}")
    for d in (g or {}).get("devices", []):
        lines.append(f"  cuda:{d['index']}: {d['name']}, compute capability {d['capability']} ({d['arch']}), "
                     f"{d['memory_gib']} GiB, {d['sms']} SMs")
    for imp in report.get("implementations", []):
        lines += ["", f"Implementations on {imp.get('device', '?')}"]
        if "error" in imp:
            _kv(lines, "error", imp["error"])
            continue
        tr = imp.get("triton", {})
        _kv(lines, "Triton", f"usable, {tr['mode']}" if tr.get("usable") else
            f"not used: {tr.get('why_not') or tr.get('error')}")
        cu = imp.get("cuda", {})
        if "error" in cu:
            _kv(lines, "CUDA libraries", f"status unknown ({cu['error']})")
        else:
            pk = cu.get("packaged", {})
            _kv(lines, "packaged libraries", (f"yes, CUDA {pk.get('cuda')}, {', '.join(pk.get('archs') or [])} "
                                              f"({pk.get('dir')})") if pk.get("manifest") else f"none: {pk.get('problem')}")
            _kv(lines, "nvcc", f"{cu.get('nvcc')} (CUDA {cu.get('nvcc_release')})" if cu.get("nvcc") else
                f"none: {cu.get('nvcc_problem')}")
            _kv(lines, "build cache", cu.get("cache") + (f" (UNUSABLE: {cu['cache_problem']})"
                                                         if cu.get("cache_problem") else ""))
            for name, rec in cu.get("libraries", {}).items():
                loaded = ", loaded" if rec.get("loaded") else ""
                _kv(lines, f"lib{name}", _lib_phrase(rec) + loaded)
        for op, rec in imp.get("ops", {}).items():
            _kv(lines, op, rec.get("uses") + (f" ({rec['why']})" if rec.get("why") else ""))
            for name, why in rec.get("not used", {}).items():
                lines.append(f"{'':25}(lib{name} not used: {why})")
    b = report.get("bitsandbytes", {})
    lines += ["", "bitsandbytes patch"]
    if "error" in b and "installed" not in b:
        _kv(lines, "error", b["error"])
    else:
        _kv(lines, "bitsandbytes", b.get("installed") or "not installed")
        _kv(lines, "entry point", "registered (" + ", ".join(
            f"{e['name']} = {e['value']} from {e['distribution']}" for e in b.get("entry_points", [])
            if e["value"] == ENTRY_VALUE) + ")" if b.get("entry_point_registered") else
            "NOT registered: import bitsandbytes does not patch (fastnf4 not installed as a distribution?)")
        env = b.get("FASTNF4_PATCH_BITSANDBYTES")
        _kv(lines, "FASTNF4_PATCH_BITSANDBYTES", f"{env if env is not None else '<unset>'} (automatic patch "
            f"{'on' if b.get('auto_patch_enabled') else 'off'})")
        _kv(lines, "import bitsandbytes", b.get("import") + (" (already imported before the doctor ran)"
                                                             if b.get("imported_before_doctor") else ""))
        if b.get("patch_error"):
            _kv(lines, "patched", f"unknown ({b['patch_error']})")
        else:
            _kv(lines, "patched", "yes" if b.get("patched") else "no")
            for op, key in b.get("patch_mode", {}).items():
                lines.append(f"{'':25}{op} at {key}")
        lines.append(f"  note: {b.get('note')}")
    e = report.get("environment", {})
    lines += ["", "Environment"]
    for k, val in {**e.get("FASTNF4", {}), **e.get("related", {})}.items():
        _kv(lines, k, val)
    if not e.get("FASTNF4"):
        lines.append("  no FASTNF4_* variable set")
    sc = report.get("self_check")
    lines += [""]
    if sc is None:
        lines.append("Self-check: not run (torch is not importable)")
    elif "error" in sc:
        lines.append(f"Self-check: FAILED to run ({sc['error']})")
    else:
        lines.append(f"Self-check on {sc['device']} against the pure-PyTorch reference (weight {sc['weight'][0]} x "
                     f"{sc['weight'][1]}; {sc['implementation']}; quantize / dequantize bit-exact, linear "
                     f"{sc['linear_bound']})")
        for c in sc["checks"]:
            lines.append(f"  {c['result']}  {c['op']:<10} {c['what']:<42} {c['implementation'] or '-'}: "
                         f"{c['detail']} [{c['seconds']:.2f} s]")
    if report.get("warnings"):
        lines += ["", "Warnings seen"]
        lines += [f"  {w}" for w in report["warnings"]]
    failed = [f"{c['op']} ({c['what']})" for c in (sc or {}).get("checks", []) if c["result"] != "PASS"]
    lines += ["", "Result: " + ("all checks PASS" if report.get("passed") else
                                "FAIL" + (": " + ", ".join(failed) if failed else ""))]
    return "\n".join(lines)


def main(as_json: bool = False) -> int:
    """Print the report (text, or JSON with ``as_json``); 0 when every check passed, else 1."""
    report = collect()
    if as_json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print(render(report))
    return 0 if report.get("passed") else 1
