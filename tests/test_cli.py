"""``fastnf4 doctor`` (fastnf4/doctor.py, parsed in fastnf4/cli.py): every section is reported, ``--json`` is JSON on
stdout, a missing or broken optional package (bitsandbytes, Triton) is reported instead of crashing, and a self-check
that fails (an op planted to return wrong values, or to raise) makes the exit status 1 and names the op.

In-process runs set FASTNF4_PATCH_BITSANDBYTES=0, so that the doctor's ``import bitsandbytes`` does not leave
fastnf4's patch in place for the tests that follow (and any patch it did apply is removed afterwards)."""
from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest
import torch

import fastnf4
from fastnf4 import _ops, _triton, api, cli, doctor

SECTIONS = ("Versions", "Platform", "GPUs", "Implementations on ", "bitsandbytes patch", "Environment",
            "Self-check on ", "Result: ")
CHECKS = [("quantize", "nf4, blocksize 64"), ("dequantize", "to bfloat16"), ("dequantize", "to float16"),
          ("linear", "M = 1,"), ("linear", "M = 16,"), ("linear", "M = 128,")]


@pytest.fixture(autouse=True)
def _quiet_patch(monkeypatch):
    from fastnf4.integrations import bitsandbytes as integ

    before = integ.is_patched()
    monkeypatch.setenv("FASTNF4_PATCH_BITSANDBYTES", "0")
    yield
    if integ.is_patched() and not before:
        integ.unpatch_bitsandbytes()


def _doctor(capsys, *args):
    rc = cli.main(["doctor", *args])
    out = capsys.readouterr().out
    return rc, out


def _check_line(out: str, op: str, what: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.lstrip().startswith(("PASS", "FAIL")) and f" {op} " in ln
             and what in ln]
    assert len(lines) == 1, (op, what, out)
    return lines[0].strip()


def _device() -> str:
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def test_doctor_reports_every_section_and_passes(capsys, monkeypatch):
    monkeypatch.setenv("FASTNF4_DOCTOR_TEST_VARIABLE", "seen")
    rc, out = _doctor(capsys)
    assert rc == 0, out
    at = [out.find("\n" + s) for s in SECTIONS]
    assert all(i >= 0 for i in at) and at == sorted(at), (at, out)  # each section, in this order
    for name in ("fastnf4", "python", "torch", "triton", "bitsandbytes", "transformers", "safetensors", "peft"):
        assert f"\n  {name + ':':<22} " in out, name
    assert f"  {'fastnf4:':<22} {fastnf4.__version__} ({os.path.dirname(fastnf4.__file__)})" in out
    assert "NVIDIA driver:" in out or not torch.cuda.is_available()
    assert f"Implementations on {_device()}" in out and f"Self-check on {_device()}" in out
    for op in ("quantize:", "dequantize:", "linear M 1-32:", "linear M > 32:", "libgemv_mma:", "libwgmma:"):
        assert f"\n  {op}" in out, op
    assert "FASTNF4_DOCTOR_TEST_VARIABLE: seen" in out and "FASTNF4_PATCH_BITSANDBYTES: 0 (automatic patch off)" in out
    assert "entry point:" in out and "patched:" in out
    for op, what in CHECKS:
        assert _check_line(out, op, what).startswith("PASS")
    assert out.rstrip().endswith("Result: all checks PASS")
    if not torch.cuda.is_available():
        assert "GPUs\n  none visible: " in out
        if _triton.use_triton(torch.device("cpu")):  # (tests/conftest.py sets TRITON_INTERPRET=1 on CPU)
            assert "Triton:                usable, interpreter (TRITON_INTERPRET=1)" in out
            assert "Triton GEMV (CPU interpreter): relative error" in _check_line(out, "linear", "M = 1,")
            assert "Triton (CPU interpreter): bit-exact" in _check_line(out, "quantize", "nf4")
        else:
            assert "reference: bit-exact" in _check_line(out, "quantize", "nf4")


def test_doctor_json(capsys):
    rc, out = _doctor(capsys, "--json")
    assert rc == 0
    report = json.loads(out)  # stdout is the JSON and nothing else
    assert report["passed"] is True
    for key in ("versions", "platform", "gpus", "implementations", "bitsandbytes", "environment", "self_check"):
        assert key in report and "error" not in report[key], key
    checks = report["self_check"]["checks"]
    assert [(c["op"], c["result"]) for c in checks] == [(op, "PASS") for op, _ in CHECKS]
    assert report["versions"]["torch"]["version"] == torch.__version__
    assert report["implementations"][0]["device"] == _device()
    assert set(report["implementations"][0]["ops"]) == {"quantize", "dequantize", "linear M 1-32", "linear M > 32"}
    assert report["environment"]["FASTNF4"]["FASTNF4_PATCH_BITSANDBYTES"] == "0"


def test_python_m_fastnf4_doctor_json(tmp_path):
    """``python -m fastnf4 doctor --json`` in a fresh process (what users run): exit 0 and only JSON on stdout, even
    with bitsandbytes writing its notices as it imports."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (os.path.dirname(os.path.dirname(os.path.abspath(fastnf4.__file__))), os.environ.get("PYTHONPATH"))
        if p)}
    r = subprocess.run([sys.executable, "-m", "fastnf4", "doctor", "--json"], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["passed"] is True and report["versions"]["fastnf4"]["path"] == os.path.dirname(fastnf4.__file__)


def _hide_distribution(monkeypatch, name):
    """importlib.metadata as if ``name`` were not installed (no version, no entry points of it)."""
    real_version, real_eps = importlib.metadata.version, importlib.metadata.entry_points

    def version(dist):
        if dist == name:
            raise importlib.metadata.PackageNotFoundError(dist)
        return real_version(dist)

    def entry_points(**kw):
        eps = real_eps(**kw)
        return [ep for ep in eps if getattr(ep, "dist", None) is None or ep.dist.name != name]

    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


@pytest.fixture
def no_triton_cache():
    _triton.triton_importable.cache_clear()
    yield
    _triton.triton_importable.cache_clear()  # (before monkeypatch puts Triton back: the next caller imports it again)


@pytest.mark.parametrize("installed", [True, False], ids=["import-fails", "not-installed"])
@pytest.mark.parametrize("name", ["bitsandbytes", "triton"])
def test_doctor_without_optional_package(capsys, monkeypatch, request, name, installed):
    if name == "triton":
        request.getfixturevalue("no_triton_cache")
    monkeypatch.setitem(sys.modules, name, None)  # ``import name`` raises ImportError
    if not installed:
        _hide_distribution(monkeypatch, name)
    rc, out = _doctor(capsys)
    assert rc == 0, out
    line = next(ln for ln in out.splitlines() if ln.startswith(f"  {name + ':':<22} "))
    want = "import FAILED: ModuleNotFoundError" if installed else "not installed, import FAILED: ModuleNotFoundError"
    assert want in line, line
    if name == "bitsandbytes":
        assert "import bitsandbytes:   ModuleNotFoundError" in out
        if not installed:
            assert f"  {'bitsandbytes:':<22} not installed" in out.split("bitsandbytes patch")[1]
    else:
        assert "Triton:                not used: Triton is not importable" in out
        assert "reference: bit-exact" in _check_line(out, "quantize", "nf4")
    for op, what in CHECKS:
        assert _check_line(out, op, what).startswith("PASS")
    rc, out = _doctor(capsys, "--json")
    report = json.loads(out)
    assert rc == 0 and report["versions"]["packages"][name]["imported"] is False
    assert (report["versions"]["packages"][name]["installed"] is None) == (not installed)


def test_doctor_says_when_the_entry_point_is_missing(capsys, monkeypatch):
    """fastnf4 not installed as a distribution (a checkout on PYTHONPATH): bitsandbytes' import does not patch."""
    _hide_distribution(monkeypatch, "fastnf4")
    rc, out = _doctor(capsys)
    assert rc == 0 and "entry point:           NOT registered" in out, out
    monkeypatch.undo()  # (the real importlib.metadata again)
    monkeypatch.setenv("FASTNF4_PATCH_BITSANDBYTES", "0")
    rc, out = _doctor(capsys)
    installed = any(ep.value == doctor.ENTRY_VALUE for ep in importlib.metadata.entry_points(group=doctor.ENTRY_GROUP))
    assert rc == 0 and ("entry point:           registered (fastnf4 = fastnf4._bnb_entry:autopatch" in out) == installed


def test_doctor_as_if_cpu_only(capsys, monkeypatch):
    """No GPU visible (as on a CPU-only machine, also where this runs on one): the self-check runs on the CPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    rc, out = _doctor(capsys)
    assert rc == 0, out
    assert "GPUs\n  none visible: " in out and "Implementations on cpu" in out and "Self-check on cpu" in out


def test_doctor_survives_a_broken_section(capsys, monkeypatch):
    def broken(*args):
        raise RuntimeError("planted")

    monkeypatch.setattr(doctor, "gpus", broken)
    monkeypatch.setattr(doctor, "platform_info", broken)
    rc, out = _doctor(capsys)
    assert "GPUs\n  error:                 RuntimeError: planted" in out
    assert "Platform\n  error:                 RuntimeError: planted" in out
    assert rc == 0 and "Result: all checks PASS" in out  # (the self-check still ran, on the CPU)


def _flip_first(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    flat = t.view(-1)
    if t.dtype == torch.uint8:
        flat[0] ^= 1
    else:
        flat[0] = -flat[0] + 1
    return t


def _plant(monkeypatch, op):
    if op == "quantize":
        real = _ops.quantize_4bit

        def quantize_4bit(A, blocksize, quant_type):
            packed, absmax = real(A, blocksize, quant_type)
            return _flip_first(packed), absmax

        monkeypatch.setattr(_ops, "quantize_4bit", quantize_4bit)
    elif op == "quantize-raises":
        def quantize_4bit(A, blocksize, quant_type):
            raise RuntimeError("planted kernel error")

        monkeypatch.setattr(_ops, "quantize_4bit", quantize_4bit)
    elif op == "dequantize":
        for name in ("dequantize_4bit", "dequantize_4bit_impl"):  # (the op and its body: api takes either)
            real = getattr(_ops, name)

            def wrong(*args, real=real):
                return _flip_first(real(*args))

            monkeypatch.setattr(_ops, name, wrong)
    else:
        real = api.linear
        monkeypatch.setattr(api, "linear", lambda x, q, bias=None: real(x, q, bias) * 1.01)


@pytest.mark.parametrize("op, failing", [
    ("quantize", ["quantize"]),
    ("quantize-raises", ["quantize"]),
    ("dequantize", ["dequantize", "dequantize"]),
    ("linear", ["linear", "linear", "linear"]),
])
def test_planted_failure_exits_1_naming_the_op(capsys, monkeypatch, op, failing):
    _plant(monkeypatch, op)
    rc, out = _doctor(capsys)
    assert rc == 1, out
    failed = [(o, w) for o, w in CHECKS if _check_line(out, o, w).startswith("FAIL")]
    assert [o for o, _ in failed] == failing, out  # only the planted op's lines fail
    assert all(_check_line(out, o, w).startswith("PASS") for o, w in CHECKS if (o, w) not in failed)
    result = out.rstrip().splitlines()[-1]
    assert result.startswith("Result: FAIL: ") and f"{failing[0]} (" in result, result
    if op == "quantize":
        assert "packed bytes: 1 of " in _check_line(out, "quantize", "nf4")
    if op == "quantize-raises":
        assert "raised RuntimeError: planted kernel error" in _check_line(out, "quantize", "nf4")
    rc, out = _doctor(capsys, "--json")
    report = json.loads(out)
    assert rc == 1 and report["passed"] is False
    assert [c["op"] for c in report["self_check"]["checks"] if c["result"] == "FAIL"] == failing
