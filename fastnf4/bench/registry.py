"""Name -> benchmark function. A benchmark takes the parsed CLI options and returns a result dict
``{"rows": [...], "table": str}``; the runner adds the environment and writes the JSON."""
from __future__ import annotations

from typing import Callable

BENCHMARKS: dict[str, Callable] = {}


def register(name: str):
    def deco(fn: Callable) -> Callable:
        BENCHMARKS[name] = fn
        return fn

    return deco


def load_all() -> None:
    from . import dequant, e2e, matmul, paper, quantize  # noqa: F401  (modules register themselves)
