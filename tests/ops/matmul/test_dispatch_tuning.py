"""The dispatch tuning tables (fastnf4/ops/matmul/tuning/*.json) and the dispatcher's import contract."""
import json
import os
import subprocess
import sys

import pytest

from fastnf4.ops.matmul import dispatch, gemv_mma, tuning

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.mark.parametrize("name", tuning.NAMES)
def test_every_rule_names_its_reason_and_measurement(name):
    with open(os.path.join(os.path.dirname(tuning.__file__), f"{name}.json")) as f:
        table = json.load(f)
    assert table["rules"], name
    for key, rule in tuning.read(name).items():
        assert set(rule) >= {"value", "why"}, key
        assert len(rule["why"]) > 20, key
        assert rule.get("results") or rule.get("commit"), key
        for path in rule.get("results", []):
            assert path.startswith("benchmarks/results/") and os.path.isfile(os.path.join(ROOT, path)), (key, path)


def test_low_bandwidth_table_overrides_only_what_differs():
    assert set(tuning.LOW_BW) == set(tuning.DEFAULT)
    differ = {key for key in tuning.DEFAULT if tuning.DEFAULT[key] != tuning.LOW_BW[key]}
    assert differ == {"wgmma_low_bw", "triton_gemm"}


def test_module_values_come_from_the_tables():
    assert dispatch.MMA_RULES == tuple(tuple(r) for r in tuning.DEFAULT["mma_rules"])
    assert gemv_mma.WIDE_MAX_ELEMS == tuning.DEFAULT["wide_max_elems"] == 96 * 2**20
    assert dispatch.choose_path(32, 8192, 8192, 64) == "dequant+matmul"
    assert dispatch.choose_path(32, 8192, 8192, 64, low_bw=True) == "gemm"


def test_builds_are_named():
    assert sorted(gemv_mma.BUILD_IDS.values()) == list(range(10))
    assert gemv_mma.choose(1, 1024, 8192, 2) == "split" and gemv_mma.choose(1, 57344, 8192, 2) == "decode"
    assert gemv_mma.build(3) == "gemm_m8" and gemv_mma.build(32) == "gemm_m32"


def test_dispatch_imports_without_triton():
    code = ("import sys, fastnf4.ops.matmul.dispatch, fastnf4.ops.matmul.eager\n"
            "assert 'triton' not in sys.modules, 'triton imported'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
