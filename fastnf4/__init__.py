"""fastnf4: fast NF4 kernels, bit-compatible with bitsandbytes.

Importing this package imports nothing else: each public name loads its module on first use, so that
bitsandbytes' backend entry point (``fastnf4._bnb_entry``) can read its switch before any of fastnf4 is
imported, and a GPU is never touched at import time.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> the module (relative to this package) that defines it
_EXPORTS = {
    "Linear4bit": "nn", "quantize_model": "nn", "repack_model": "nn",
    "NF4Weight": "format",
    "dequantize": "api", "linear": "api", "quantize": "api",
    "LAYOUTS": "layouts", "repack": "layouts",
    "patch_bitsandbytes": "integrations.bitsandbytes", "unpatch_bitsandbytes": "integrations.bitsandbytes",
    "NF4Config": "integrations.hf_quantizer",
}
__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fastnf4' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
