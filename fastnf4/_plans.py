"""The table of prepared launches kept beside each ``NF4Weight`` (filled by ``ops/matmul/eager.py``).

It lives apart from the launch code so that the weight type can drop a weight's entries when a field changes
without importing the op contract or any kernel module (no import cycle: ``format`` -> ``_plans`` only).
"""
from __future__ import annotations

import weakref

# NF4Weight -> {(dtype, M key, device index): (addresses, bias, Prepared | None)}. Kept beside the weights, not in
# them, so that copying, deep-copying or pickling an NF4Weight never meets a ctypes object.
PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def forget(q) -> None:
    """Drop the cached launches of ``q`` (called when a field of ``q`` is reassigned)."""
    PLANS.pop(q, None)
