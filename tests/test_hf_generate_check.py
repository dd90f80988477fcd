"""tools/hf_generate_check.py (issue 59's H200 check) on the CPU: ``--tiny`` in a subprocess (a 2-layer tiny Qwen3
written as a bnb-4bit checkpoint, loaded by from_pretrained into fastnf4's layers, greedy generate eager and through
transformers' compiled call with Dynamo's "eager" backend: the CPU has no automatic compile and inductor would take
minutes here; no timing, no bench), and its report of the first differing token."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

TOOL = os.path.join(os.path.dirname(__file__), "..", "tools", "hf_generate_check.py")


def tool():
    spec = importlib.util.spec_from_file_location("hf_generate_check", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tiny_run_on_cpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # (the PyTorch reference path on CPU)
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run([sys.executable, TOOL, str(tmp_path), "--tiny", "--new-tokens", "16", "--prompt", "8"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads((tmp_path / "cpu-hf-generate-tiny.json").read_text())
    assert r["tokens_equal"] and r["first_difference"] is None
    assert len(r["eager_tokens"]) == 16 and r["eager_tokens"] == r["compiled_tokens"]
    assert r["compiled_call"] and r["dynamo_graphs"] >= 1  # the compiled run went through Dynamo
    assert r["loader"]["layer_classes"] == ["fastnf4.nn.Linear4bit"] and r["loader"]["four_bit_layers"] == 14
    assert r["loader"]["quantizer"] == "FastNF4Quantizer"
    assert r["generate"]["eager"]["disable_compile"] and r["generate"]["compiled"]["cache_implementation"] == "static"
    assert "timing" not in r and "e2e" not in r
    assert "compiled == eager: True" in proc.stdout


def test_full_check_refuses_the_cpu(tmp_path):
    assert tool().main([str(tmp_path), "--device", "cpu"]) == 2


def test_first_difference_report():
    first_difference = tool().first_difference
    assert first_difference([1, 2, 3], [1, 2, 3], None, None) is None
    eager = [torch.tensor([[0.0, 5.0, 1.0]]), torch.tensor([[3.0, 2.9, 0.0]])]
    compiled = [torch.tensor([[0.0, 5.0, 1.5]]), torch.tensor([[2.9, 3.0, 0.0]])]
    d = first_difference([1, 0], [1, 1], eager, compiled)
    assert d["step"] == 1 and (d["eager_token"], d["compiled_token"]) == (0, 1) and d["equal_tokens"] == 1
    assert d["eager_top2_gap"] == pytest.approx(0.1) and d["compiled_top2_gap"] == pytest.approx(0.1)
    assert d["max_logit_diff_up_to_step"] == pytest.approx(0.5)
