"""bitsandbytes' backend entry point for fastnf4 (group ``bitsandbytes.backends`` in pyproject.toml).

bitsandbytes imports this module and calls :func:`autopatch` inside its own ``import bitsandbytes``, and turns any
exception raised here into ``RuntimeError: bitsandbytes: failed to load backend fastnf4``. So this module imports
nothing at import time (the package ``__init__`` is lazy too), reads ``FASTNF4_PATCH_BITSANDBYTES`` before anything of
fastnf4 is imported, and turns every failure of the patch into one warning: ``import bitsandbytes`` then succeeds
with bitsandbytes' own kernels.
"""
from __future__ import annotations

import os
import warnings

_OFF = ("0", "false", "off", "no")


def enabled() -> bool:
    """The automatic patch is on unless ``FASTNF4_PATCH_BITSANDBYTES`` is 0 / false / off / no."""
    return os.environ.get("FASTNF4_PATCH_BITSANDBYTES", "1").strip().lower() not in _OFF


def autopatch() -> None:
    """Route bitsandbytes' CUDA 4-bit ops to fastnf4 (``fastnf4.patch_bitsandbytes``); never raises."""
    if not enabled():
        return
    try:
        from .integrations.bitsandbytes import patch_bitsandbytes

        patch_bitsandbytes(("cuda",))
    except Exception as e:  # noqa: BLE001  (bitsandbytes must import whatever went wrong in fastnf4)
        _undo()
        warnings.warn(f"fastnf4 could not patch bitsandbytes ({type(e).__name__}: {e}); bitsandbytes' own kernels "
                      "stay in use. Set FASTNF4_PATCH_BITSANDBYTES=0 to silence this, and please report it with the "
                      "output of `fastnf4 doctor`.", RuntimeWarning, stacklevel=2)


def _undo() -> None:
    """Remove a partial patch, if the patch module imported at all."""
    import sys

    module = sys.modules.get("fastnf4.integrations.bitsandbytes")
    if module is not None:
        try:
            module.unpatch_bitsandbytes()
        except Exception:  # noqa: BLE001  (already failing: the warning above names the first error)
            pass
