"""Per-GPU tuning tables of the matmul dispatch and plans, as data (``<gpu>.json`` beside this file).

``h200.json`` is the default table; ``h100.json`` lists only the rules that differ on GPUs of less memory
bandwidth per SM cycle (it names ``h200`` as its base). Each rule is ``{"value", "why", "results" and/or
"commit"}``; the code reads only ``value``. ``dispatch.py`` says which table a GPU takes.
"""
from __future__ import annotations

import json
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = ("h200", "h100")


def read(name: str) -> dict:
    """The rules of ``<name>.json`` (each with its why and results), merged over its base table's."""
    with open(os.path.join(_HERE, f"{name}.json")) as f:
        table = json.load(f)
    rules = read(table["base"]) if "base" in table else {}
    rules.update(table["rules"])
    return rules


def values(name: str) -> dict:
    """``{rule: value}`` of one table."""
    return {key: rule["value"] for key, rule in read(name).items()}


DEFAULT = values("h200")   # every GPU with at least the H200's bandwidth per SM cycle, and unknown ones
LOW_BW = values("h100")    # GPUs of less
