"""Run bitsandbytes' own 4-bit tests twice, without fastnf4 and with its patch on, and report every test whose outcome
differs. The rule it checks: every test that passes with bitsandbytes alone passes with the patch on.

    python tools/bnb_conformance.py --tests ../shared/peers/bitsandbytes-tests --workers 8 --out result.json

The suite is copied to a scratch folder as ``tests/`` (it imports ``tests.helpers``) and run with pytest, bitsandbytes'
own options (``-m 'not slow and not benchmark and not deprecated'``) and ``-k`` selecting the 4-bit tests. This file
is also the pytest plugin (``-p bnb_conformance``) that sets the patch in every test process (xdist workers too):

* ``off``: ``FASTNF4_PATCH_BITSANDBYTES=0``; the plugin checks that no fastnf4 patch is in place.
* ``on``: the plugin calls ``fastnf4._bnb_entry.autopatch()`` after ``import bitsandbytes`` (what the installed entry
  point does; a checkout on PYTHONPATH has no entry point) and checks the patch is in place. ``--patch-devices cpu,cuda``
  patches those device types instead (``fastnf4.patch_bitsandbytes``), e.g. to run the CPU tests on a CPU machine.

Writes JSON (versions, counts per outcome for each run, the tests whose outcome differs) and prints a summary; exits 1
when a test that passed without fastnf4 did not pass with it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

SELECT = "4bit or nf4 or fp4 or Linear4bit"
FILES = ("test_functional.py", "test_ops.py", "test_linear4bit.py", "test_autograd.py", "test_modules.py",
         "test_parametrize.py")
_MODE = "FASTNF4_CONFORMANCE_MODE"
_DEVICES = "FASTNF4_CONFORMANCE_DEVICES"


# ----------------------------------------------------------------------------------------------- the pytest plugin
def pytest_configure(config):  # noqa: ARG001  (pytest hook)
    mode = os.environ.get(_MODE)
    if mode is None:
        return
    import bitsandbytes  # noqa: F401  (runs bitsandbytes' entry points, fastnf4's among them when installed)
    from fastnf4.integrations import bitsandbytes as integ

    if mode == "off":
        if integ.is_patched():
            raise RuntimeError("conformance 'off' run: the fastnf4 patch is in place (FASTNF4_PATCH_BITSANDBYTES=0 unset?)")
        return
    devices = tuple(d for d in os.environ.get(_DEVICES, "").split(",") if d)
    if devices:
        integ.patch_bitsandbytes(devices)
    elif not integ.is_patched():
        from fastnf4 import _bnb_entry

        _bnb_entry.autopatch()
    if not integ.is_patched():
        raise RuntimeError("conformance 'on' run: the fastnf4 patch could not be applied")


# ----------------------------------------------------------------------------------------------------- the runner
def _outcomes(junit: str) -> dict[str, str]:
    """{test id: passed | failed | error | skipped} from a JUnit XML report."""
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        tid = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcome = ("failed" if "failure" in kinds else "error" if "error" in kinds
                   else "skipped" if "skipped" in kinds else "passed")
        if result.get(tid) in ("failed", "error"):
            continue  # (a teardown error reported beside a failure: keep the first)
        result[tid] = outcome
    return result


def _run(mode: str, work: str, opts, env_extra: dict) -> tuple[dict, float, str]:
    junit = os.path.join(work, f"junit-{mode}.xml")
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, _MODE: mode, "FASTNF4_PATCH_BITSANDBYTES": "1" if mode == "on" else "0",
           "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p),
           "PYTHONDONTWRITEBYTECODE": "1", **env_extra}
    if mode == "on" and opts.patch_devices:
        env[_DEVICES] = opts.patch_devices
    cmd = [sys.executable, "-m", "pytest", *[os.path.join("tests", f) for f in opts.files], "-k", opts.k,
           "-m", "not slow and not benchmark and not deprecated", "-p", "bnb_conformance", "-p", "no:cacheprovider",
           "-q", "--tb=line", "-o", "addopts=", f"--junitxml={junit}"]
    if opts.workers > 1:
        cmd += ["-n", str(opts.workers)]
    start = time.time()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    took = time.time() - start
    log = proc.stdout + proc.stderr
    if not os.path.exists(junit):
        raise SystemExit(f"pytest ({mode}) wrote no report (exit {proc.returncode}):\n{log[-6000:]}")
    return _outcomes(junit), took, log


def _versions() -> dict:
    import torch

    info = {"python": sys.version.split()[0], "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    for name in ("bitsandbytes", "fastnf4", "triton"):
        try:
            info[name] = __import__(name).__version__
        except Exception as e:  # noqa: BLE001  (recorded, not fatal)
            info[name] = f"unavailable ({type(e).__name__})"
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tests", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "peers",
                                                     "bitsandbytes-tests"), help="bitsandbytes' tests folder")
    ap.add_argument("--files", nargs="*", default=list(FILES), help="test files to run (default: %(default)s)")
    ap.add_argument("-k", default=SELECT, help="pytest -k expression (default: %(default)r)")
    ap.add_argument("--workers", type=int, default=1, help="pytest-xdist workers per run")
    ap.add_argument("--device", default=None, help="BNB_TEST_DEVICE for bitsandbytes' tests (e.g. cuda, cpu)")
    ap.add_argument("--patch-devices", default="", help="'on' run: patch these device types (default: the entry "
                                                        "point's, CUDA)")
    ap.add_argument("--parallel", action="store_true", help="run the two passes at the same time")
    ap.add_argument("--out", default=None, help="JSON result file")
    opts = ap.parse_args(argv)

    work = tempfile.mkdtemp(prefix="bnb-conformance-")
    shutil.copytree(opts.tests, os.path.join(work, "tests"), ignore=shutil.ignore_patterns("__pycache__"))
    env_extra = {"BNB_TEST_DEVICE": opts.device} if opts.device else {}
    if opts.parallel:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(2) as pool:
            off_f, on_f = (pool.submit(_run, m, work, opts, env_extra) for m in ("off", "on"))
            (off, t_off, log_off), (on, t_on, log_on) = off_f.result(), on_f.result()
    else:
        off, t_off, log_off = _run("off", work, opts, env_extra)
        if opts.out:  # (what is known so far, should the second pass not finish)
            with open(opts.out, "w") as f:
                json.dump({"partial": "off pass only", "seconds": round(t_off, 1), "off": off}, f)
        on, t_on, log_on = _run("on", work, opts, env_extra)

    def counts(r):
        c: dict = {}
        for v in r.values():
            c[v] = c.get(v, 0) + 1
        return c

    differ = {t: {"off": off.get(t, "absent"), "on": on.get(t, "absent")}
              for t in sorted(set(off) | set(on)) if off.get(t) != on.get(t)}
    regressions = sorted(t for t, d in differ.items() if d["off"] == "passed")
    payload = {
        "what": "bitsandbytes' own 4-bit tests without fastnf4 (off) and with its patch (on)",
        "versions": _versions(), "files": opts.files, "k": opts.k, "device": opts.device,
        "patch_devices": opts.patch_devices or "entry point (cuda)", "workers": opts.workers,
        "seconds": {"off": round(t_off, 1), "on": round(t_on, 1)},
        "counts": {"off": counts(off), "on": counts(on)}, "tests_run": {"off": len(off), "on": len(on)},
        "differ": differ, "regressions": regressions,
        "log_tail": {"off": log_off[-3000:], "on": log_on[-3000:]},
    }
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump(payload, f, indent=1)
    print(f"tests: off {len(off)} {counts(off)} in {t_off:.0f} s; on {len(on)} {counts(on)} in {t_on:.0f} s")
    print(f"outcomes that differ: {len(differ)}; passed off but not on: {len(regressions)}")
    for t in list(differ)[:50]:
        print(f"  {differ[t]['off']:>7} -> {differ[t]['on']:<7} {t}")
    shutil.rmtree(work, ignore_errors=True)
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
