"""The bitsandbytes entry point cannot hurt ``import bitsandbytes``: it reads its switch before importing any of
fastnf4, and any failure of fastnf4 leaves bitsandbytes importable with its own kernels and one warning. Each case
runs in a fresh interpreter, as bitsandbytes' import is once per process."""
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

pytest.importorskip("bitsandbytes")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})


def test_the_entry_point_is_the_small_module():
    eps = [ep for ep in entry_points(group="bitsandbytes.backends") if ep.name == "fastnf4"]
    assert [ep.value for ep in eps] == ["fastnf4._bnb_entry:autopatch"]


def test_switched_off_it_imports_nothing_of_fastnf4():
    r = _run("import sys, bitsandbytes\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'fastnf4'))",
             FASTNF4_PATCH_BITSANDBYTES="0")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "['fastnf4', 'fastnf4._bnb_entry']"


@pytest.mark.parametrize("switch", ["1", "0"])
def test_a_broken_fastnf4_leaves_bitsandbytes_importable(switch):
    # the patch module cannot be imported (as for any import-time failure of fastnf4's kernels or their packages)
    code = """
import sys, warnings
sys.modules["fastnf4.integrations.bitsandbytes"] = None
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    import bitsandbytes
import torch, bitsandbytes.functional as F
p, qs = F.quantize_4bit(torch.randn(64, 64), blocksize=64, quant_type="nf4")
assert F.dequantize_4bit(p, qs).shape == (64, 64)
print([str(w.message) for w in seen if "fastnf4" in str(w.message)])
"""
    r = _run(code, FASTNF4_PATCH_BITSANDBYTES=switch)
    assert r.returncode == 0, r.stderr[-3000:]
    messages = eval(r.stdout.strip().splitlines()[-1])  # noqa: S307  (our own printed list of strings)
    if switch == "0":
        assert messages == []
    else:
        assert len(messages) == 1 and "could not patch bitsandbytes" in messages[0], messages


def test_the_weight_type_does_not_import_the_op_contract():
    """No import cycle: format (the weight type) -> _plans only; importing it first pulls in no kernel module."""
    r = _run("import sys, fastnf4.format\n"
             "print(sorted(m for m in sys.modules if m.startswith('fastnf4')))")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "['fastnf4', 'fastnf4._plans', 'fastnf4.codebooks', 'fastnf4.format']"


@pytest.mark.parametrize("module", ["fastnf4.format", "fastnf4._ops", "fastnf4.ops.matmul.eager", "fastnf4.api",
                                    "fastnf4.nn", "fastnf4.integrations.bitsandbytes",
                                    "fastnf4.integrations.transformers"])
def test_every_core_module_imports_first(module):
    r = _run(f"import {module}, fastnf4\nprint(fastnf4.linear.__module__)", FASTNF4_PATCH_BITSANDBYTES="0")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "fastnf4.api"
