"""The wheel carries fastnf4's CUDA libraries (setup.py) and the loader prefers them (fastnf4/_cuda.py).

* Loader logic, on a fake manifest and a faked device architecture: the packaged library is chosen when it has
  code for the GPU and matches its hashes, refused otherwise (hash, source, driver), then the JIT build, then one
  warning per library (or a RuntimeError under FASTNF4_STRICT=1).
* Wheel builds with a fake nvcc (fast: contents, manifest, tag, one nvcc call per library), without nvcc (a pure
  wheel, a loud message; FASTNF4_REQUIRE_CUDA_BUILD=1 fails), and with the real nvcc narrowed to sm_90
  (FASTNF4_CUDA_ARCHS=90; minutes). ``FASTNF4_TEST_WHEEL=<path>`` checks a prebuilt full wheel instead of the
  narrowed build (its manifest, hashes and the architectures cuobjdump lists).
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import types
import warnings
import zipfile

import pytest
import torch

from fastnf4 import _cuda
from test_build_cache import FAKE_NVCC

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX build and permissions")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GEMV, WGMMA = _cuda.LIBRARIES["gemv_mma"], _cuda.LIBRARIES["wgmma"]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _no_nvcc_path() -> str:
    return os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                           if d and not os.path.exists(os.path.join(d, "nvcc")))


# --- the loader ---------------------------------------------------------------------------------------------------

@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """A fake installed package: sources, ``_lib`` with two libraries and their manifest; a device whose
    architecture the test sets (``pkg.arch``); CDLL records the bytes it loads; no nvcc unless ``pkg.nvcc()``."""
    src = tmp_path / "pkg" / "ops" / "matmul"
    src.mkdir(parents=True)
    (src / "gemv_mma.cu").write_text("// gemv source\n")
    (src / "wgmma.cu").write_text("// wgmma source\n")
    lib_dir = tmp_path / "pkg" / "_lib"
    lib_dir.mkdir()
    (lib_dir / "libgemv_mma.so").write_bytes(b"packaged gemv")
    (lib_dir / "libwgmma.so").write_bytes(b"packaged wgmma")
    manifest = {
        "format": 1, "nvcc_version": "fake", "cuda_version": "13.0", "min_driver_cuda": "13.0", "flags": [],
        "archs": ["sm_80", "sm_86", "sm_89", "sm_90"], "missing": {},
        "libraries": {
            "gemv_mma": {"file": "libgemv_mma.so", "source": GEMV.source, "sha256": _sha(b"packaged gemv"),
                         "source_sha256": _sha(b"// gemv source\n"), "sass": ["sm_80", "sm_86", "sm_89", "sm_90"],
                         "ptx": ["compute_80", "compute_90"]},
            "wgmma": {"file": "libwgmma.so", "source": WGMMA.source, "sha256": _sha(b"packaged wgmma"),
                      "source_sha256": _sha(b"// wgmma source\n"), "sass": ["sm_90a"], "ptx": []},
        },
    }

    def write_manifest():
        (lib_dir / "manifest.json").write_text(json.dumps(manifest))
        _cuda._forget()

    write_manifest()
    monkeypatch.setattr(_cuda, "PACKAGE_DIR", str(tmp_path / "pkg"))
    monkeypatch.setattr(_cuda, "PACKAGED_DIR", str(lib_dir))
    for name in ("FASTNF4_NVCC", "CUDA_HOME", "FASTNF4_STRICT", "FASTNF4_CUDA", "FASTNF4_NVCC_FLAGS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", _no_nvcc_path())
    monkeypatch.setenv("FASTNF4_CACHE", str(tmp_path / "cache"))
    log = tmp_path / "nvcc.log"
    log.write_text("")
    monkeypatch.setenv("FAKE_NVCC_LOG", str(log))
    state = types.SimpleNamespace(arch="sm_90", driver=13000, loaded=[], fail_paths=set(), log=log,
                                  manifest=manifest, write_manifest=write_manifest, lib_dir=lib_dir,
                                  gemv=str(src / "gemv_mma.cu"), wgmma=str(src / "wgmma.cu"))

    def nvcc():
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        (bin_dir / "nvcc").write_text(FAKE_NVCC)
        (bin_dir / "nvcc").chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def builds():
        return [ln for ln in log.read_text().splitlines() if ln.strip()]

    def cdll(path, *args, **kwargs):
        if path in state.fail_paths:
            raise OSError(f"{path}: cannot open shared object file")
        with open(path, "rb") as f:
            state.loaded.append(f.read())
        return types.SimpleNamespace(_name=path)

    state.nvcc, state.builds = nvcc, builds
    monkeypatch.setattr(ctypes, "CDLL", cdll)
    monkeypatch.setattr(_cuda, "device_arch", lambda index: state.arch)
    monkeypatch.setattr(_cuda, "_driver_cuda_version", lambda: state.driver)
    yield state
    _cuda._forget()


def _load(pkg, source, suffix="", index=0):
    return _cuda.load(source, torch.device("cuda", index), arch_suffix=suffix)


def test_packaged_library_is_chosen_when_present(pkg):
    pkg.nvcc()  # even with nvcc there: the packaged library comes first
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _load(pkg, pkg.gemv) is not None
        assert _load(pkg, pkg.wgmma, "a") is not None
    assert pkg.loaded == [b"packaged gemv", b"packaged wgmma"] and pkg.builds() == []
    st = _cuda.status(torch.device("cuda", 0))
    assert st["libraries"]["gemv_mma"]["source"] == "packaged" and st["libraries"]["gemv_mma"]["loaded"]
    assert st["libraries"]["wgmma"]["source"] == "packaged" and st["libraries"]["wgmma"]["arch"] == "sm_90a"


@pytest.mark.parametrize("sass, ptx, arch, ok", [
    (["sm_80", "sm_90"], ["compute_80", "compute_90"], "sm_90", True),  # exact SASS
    (["sm_80", "sm_90"], ["compute_80", "compute_90"], "sm_86", True),  # PTX 80 at level 80
    (["sm_80", "sm_90"], ["compute_80", "compute_90"], "sm_120", True),  # PTX 90 at level 90
    (["sm_80", "sm_90"], ["compute_80"], "sm_100", False),  # PTX 80 would drop the sm_90+ code paths
    (["sm_90"], ["compute_90"], "sm_89", False),  # PTX newer than the device
    (["sm_90"], [], "sm_100", False),
])
def test_packaged_gemv_needs_code_for_the_device(pkg, sass, ptx, arch, ok):
    pkg.manifest["libraries"]["gemv_mma"].update(sass=sass, ptx=ptx)
    pkg.write_manifest()
    pkg.arch = arch
    pkg.nvcc()
    assert _load(pkg, pkg.gemv) is not None
    assert (pkg.loaded == [b"packaged gemv"]) == ok and (pkg.builds() == []) == ok  # else the JIT build
    assert _cuda.covers(pkg.manifest["libraries"]["gemv_mma"], arch, GEMV) == ok


def test_wgmma_is_for_sm90a_only(pkg):
    assert _cuda.covers(pkg.manifest["libraries"]["wgmma"], "sm_90a", WGMMA)
    assert not _cuda.covers(pkg.manifest["libraries"]["wgmma"], "sm_90", WGMMA)
    assert not _cuda.covers({"sass": ["sm_90a"], "ptx": ["compute_90a"]}, "sm_100a", WGMMA)
    for arch in ("sm_89", "sm_100", "sm_75"):  # not for these GPUs: no library, and no warning either
        pkg.arch = arch
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert _load(pkg, pkg.wgmma, "a") is None
    pkg.arch = "sm_75"  # the gemv kernels need Ampere
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _load(pkg, pkg.gemv) is None
    assert pkg.loaded == []


@pytest.mark.parametrize("defect", ["library", "source", "driver", "manifest", "file-name", "cdll"])
def test_packaged_library_refused_then_jit(pkg, defect):
    """A packaged library that fails a check is never loaded: the JIT build takes over (fake nvcc)."""
    if defect == "library":
        (pkg.lib_dir / "libgemv_mma.so").write_bytes(b"replaced gemv")
    elif defect == "source":
        with open(pkg.gemv, "a") as f:
            f.write("// edited after the wheel was built\n")
    elif defect == "driver":
        pkg.driver = 12040
    elif defect == "manifest":
        (pkg.lib_dir / "manifest.json").write_text("{ not json")
        _cuda._forget()
    elif defect == "file-name":
        pkg.manifest["libraries"]["gemv_mma"]["file"] = "../../evil.so"
        pkg.write_manifest()
    else:
        pkg.fail_paths.add(str(pkg.lib_dir / "libgemv_mma.so"))
    pkg.nvcc()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _load(pkg, pkg.gemv) is not None
    assert len(pkg.builds()) == 1 and len(pkg.loaded) == 1 and pkg.loaded[0].startswith(b"fake library")
    # a library that fails its hash is worth a word even though the JIT build stands in; the other cases are quiet
    assert [str(w.message) for w in caught] == (
        [f"fastnf4: the prebuilt {pkg.lib_dir / 'libgemv_mma.so'} does not match the manifest's SHA-256 (damaged or "
         "replaced): refused"] if defect == "library" else [])
    rec = _cuda.status(torch.device("cuda", 0))["libraries"]["gemv_mma"]
    assert rec["source"] == "jit-cache" and rec["loaded"]
    want = {"library": "SHA-256", "source": "another version", "driver": "driver", "manifest": "unreadable",
            "file-name": "bad file", "cdll": "failed to load"}[defect]
    assert want in rec["reason"]


def test_unavailable_warns_once_per_library(pkg, tmp_path):
    (pkg.lib_dir / "manifest.json").unlink()
    _cuda._forget()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert _load(pkg, pkg.gemv) is None
        pkg.arch = "sm_80"  # a second GPU of another kind: still the same library
        assert _load(pkg, pkg.gemv, index=1) is None
        pkg.arch = "sm_90"
        assert _load(pkg, pkg.wgmma, "a") is None
    msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 2, msgs
    gemv = next(m for m in msgs if "libgemv_mma" in m)
    assert "decode-size" in gemv and "Triton" in gemv and "no nvcc" in gemv and "FASTNF4_STRICT" in gemv
    assert "no prebuilt CUDA libraries" in gemv and "install" in gemv
    assert pkg.loaded == []
    st = _cuda.status(torch.device("cuda", 0))["libraries"]
    assert st["gemv_mma"]["source"] == "unavailable" and "no nvcc" in st["gemv_mma"]["reason"]


def test_unavailable_names_a_refused_library(pkg):
    (pkg.lib_dir / "libgemv_mma.so").write_bytes(b"replaced gemv")
    with pytest.warns(RuntimeWarning, match="SHA-256"):
        assert _load(pkg, pkg.gemv) is None
    assert pkg.loaded == []


def test_strict_mode_raises(pkg, monkeypatch):
    (pkg.lib_dir / "manifest.json").unlink()
    _cuda._forget()
    monkeypatch.setenv("FASTNF4_STRICT", "1")
    for _ in range(2):  # every call, not only the first
        with pytest.raises(RuntimeError, match="libgemv_mma.*unavailable"):
            _load(pkg, pkg.gemv)
    monkeypatch.setenv("FASTNF4_STRICT", "0")
    with pytest.warns(RuntimeWarning):
        assert _load(pkg, pkg.gemv) is None


def test_strict_mode_is_quiet_when_the_library_loads(pkg, monkeypatch):
    monkeypatch.setenv("FASTNF4_STRICT", "1")
    assert _load(pkg, pkg.gemv) is not None


def test_cuda_switched_off(pkg, monkeypatch):
    monkeypatch.setenv("FASTNF4_CUDA", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _load(pkg, pkg.gemv) is None
    assert pkg.loaded == [] and _cuda.disabled()
    assert _cuda.status(torch.device("cuda", 0))["libraries"]["gemv_mma"]["source"] == "disabled"
    assert _cuda.load(pkg.gemv, torch.device("cpu")) is None


def test_status_without_building(pkg):
    pkg.manifest["libraries"]["gemv_mma"].update(sass=["sm_80"], ptx=["compute_80"])
    pkg.write_manifest()
    pkg.arch = "sm_100"
    st = _cuda.status(torch.device("cuda", 0))
    assert st["arch"] == "sm_100" and st["nvcc"] is None and st["packaged"]["cuda"] == "13.0"
    assert st["libraries"]["gemv_mma"]["source"] == "unavailable"
    assert "no code for sm_100" in st["libraries"]["gemv_mma"]["reason"]
    assert st["libraries"]["wgmma"]["source"] == "not-applicable"
    pkg.nvcc()
    _cuda._forget()
    st = _cuda.status(torch.device("cuda", 0))
    assert st["libraries"]["gemv_mma"]["source"] == "jit-pending" and pkg.builds() == []
    assert _load(pkg, pkg.gemv) is not None
    _cuda._forget()  # a new process: the verified cache entry is found
    assert _cuda.status(torch.device("cuda", 0))["libraries"]["gemv_mma"]["source"] == "jit-cache"
    assert _cuda.status(torch.device("cpu"))["libraries"]["gemv_mma"]["source"] == "not-applicable"


def test_arch_list_and_targets():
    assert _cuda.parse_archs(None) == _cuda.parse_archs("") == (80, 86, 89, 90)
    assert _cuda.parse_archs("90") == (90,)
    assert _cuda.parse_archs("sm_90, 8.0;86 89") == (80, 86, 89, 90)
    assert _cuda.parse_archs("none") == ()
    with pytest.raises(ValueError):
        _cuda.parse_archs("75")
    with pytest.raises(ValueError):
        _cuda.parse_archs("ampere")
    assert _cuda.package_targets(GEMV, (80, 86, 89, 90)) == (["sm_80", "sm_86", "sm_89", "sm_90"],
                                                             ["compute_80", "compute_90"])
    assert _cuda.package_targets(GEMV, (90,)) == (["sm_90"], ["compute_90"])
    assert _cuda.package_targets(GEMV, (86, 100)) == (["sm_86", "sm_100"], ["compute_86", "compute_100"])
    assert _cuda.package_targets(WGMMA, (80, 86, 89, 90)) == (["sm_90a"], [])
    assert _cuda.package_targets(WGMMA, (80,)) == ([], [])
    assert _cuda.fat_gencode(["sm_90"], ["compute_90"]) == ["-gencode=arch=compute_90,code=sm_90",
                                                            "-gencode=arch=compute_90,code=compute_90"]


# --- wheels -------------------------------------------------------------------------------------------------------

def _project_copy(dest):
    """The files a wheel is built from (the checkout is shared: build there, not here)."""
    os.makedirs(dest)
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy(os.path.join(ROOT, name), dest)
    shutil.copytree(os.path.join(ROOT, "fastnf4"), os.path.join(dest, "fastnf4"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "_lib", "*.so"))
    return dest


def _build_wheel(tmp_path, env_update, drop=()):
    src = _project_copy(str(tmp_path / "src"))
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("FASTNF4_")}
    env.update(env_update)
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-v",
                          "-w", str(tmp_path / "dist")], cwd=src, env=env, capture_output=True, text=True)
    wheels = [os.path.join(tmp_path / "dist", n) for n in os.listdir(tmp_path / "dist")] if res.returncode == 0 else []
    return res, wheels


def _check_wheel(path, extract_to) -> dict:
    """Contents: the CUDA sources, the manifest and its libraries, hashes matching; returns the manifest with the
    extracted libraries' paths under ``_paths``."""
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        assert {"fastnf4/ops/matmul/gemv_mma.cu", "fastnf4/ops/matmul/wgmma.cu", "fastnf4/_cuda.py",
                "fastnf4/_lib/manifest.json"} <= names
        manifest = json.loads(z.read("fastnf4/_lib/manifest.json"))
        assert manifest["format"] == 1 and manifest["cuda_version"] and manifest["min_driver_cuda"]
        assert manifest["cuda_version"] in manifest["nvcc_version"]
        z.extractall(extract_to)
    paths = {}
    for name, entry in manifest["libraries"].items():
        lib = os.path.join(extract_to, "fastnf4", "_lib", entry["file"])
        assert _cuda.sha256_file(lib) == entry["sha256"], name
        source = os.path.join(extract_to, "fastnf4", *entry["source"].split("/"))
        assert _cuda.source_sha256(source) == entry["source_sha256"], name
        assert _cuda.source_sha256(source) == _cuda.source_sha256(os.path.join(ROOT, "fastnf4", entry["source"]))
        paths[name] = lib
    manifest["_paths"] = paths
    assert re.search(r"-py3-none-linux_\w+\.whl$", os.path.basename(path)), path
    return manifest


def test_wheel_with_fake_nvcc(tmp_path):
    """Fast: one nvcc call per library with every target, the manifest, the tag, the sources."""
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    log = tmp_path / "nvcc.log"
    res, wheels = _build_wheel(tmp_path, {"FASTNF4_NVCC": str(nvcc), "FAKE_NVCC_LOG": str(log)})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert len(wheels) == 1
    manifest = _check_wheel(wheels[0], str(tmp_path / "x"))
    assert manifest["libraries"]["gemv_mma"]["sass"] == ["sm_80", "sm_86", "sm_89", "sm_90"]
    assert manifest["libraries"]["gemv_mma"]["ptx"] == ["compute_80", "compute_90"]
    assert manifest["libraries"]["wgmma"]["sass"] == ["sm_90a"] and manifest["missing"] == {}
    calls = [ln for ln in log.read_text().splitlines() if ln.strip()]
    assert len(calls) == 2 and all("--threads 0" in c and "-O3" in c for c in calls)
    gemv = next(c for c in calls if "gemv_mma.cu" in c)
    assert gemv.count("-gencode") == 6 and "code=compute_90" in gemv
    # installed, the loader finds and verifies the packaged library (the fake file cannot be dlopen'ed: not asked)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), wheels[0]],
                   check=True, capture_output=True)
    probe = ("import os, fastnf4._cuda as c; c._driver_cuda_version = lambda: None; "
             "lib = c.LIBRARIES['gemv_mma']; "
             "p, why = c._packaged(lib, os.path.join(c.PACKAGE_DIR, lib.source), 'sm_89'); "
             "assert p and p.startswith(os.path.realpath(os.environ['TARGET'])), (p, why); print('ok', p)")
    env = {**os.environ, "PYTHONPATH": str(target), "TARGET": str(target)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, cwd=str(tmp_path))
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize("case", ["narrowed", "nvcc-fails"])
def test_wheel_with_fake_nvcc_partial(tmp_path, case):
    """FASTNF4_CUDA_ARCHS=80 leaves libwgmma out on purpose (no failure, even with FASTNF4_REQUIRE_CUDA_BUILD=1);
    an nvcc that fails leaves a pure wheel and says so (FASTNF4_REQUIRE_CUDA_BUILD=1 would fail the build)."""
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    env = {"FASTNF4_NVCC": str(nvcc), "FAKE_NVCC_LOG": str(tmp_path / "nvcc.log")}
    if case == "narrowed":
        env.update(FASTNF4_CUDA_ARCHS="80", FASTNF4_REQUIRE_CUDA_BUILD="1")
    else:
        env.update(FAKE_NVCC_FAIL="1")
    res, wheels = _build_wheel(tmp_path, env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    if case == "narrowed":
        manifest = _check_wheel(wheels[0], str(tmp_path / "x"))
        assert list(manifest["libraries"]) == ["gemv_mma"] and "wgmma" in manifest["missing"]
        assert manifest["libraries"]["gemv_mma"]["sass"] == ["sm_80"]
        assert manifest["libraries"]["gemv_mma"]["ptx"] == ["compute_80"]
    else:
        assert wheels[0].endswith("-py3-none-any.whl")
        assert "libgemv_mma.so was NOT built" in res.stderr + res.stdout


def test_wheel_without_nvcc_is_pure_and_says_so(tmp_path):
    res, wheels = _build_wheel(tmp_path, {"PATH": _no_nvcc_path()}, drop=("CUDA_HOME",))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "NO prebuilt CUDA libraries" in res.stdout + res.stderr
    assert len(wheels) == 1 and wheels[0].endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheels[0]) as z:
        names = z.namelist()
    assert "fastnf4/ops/matmul/gemv_mma.cu" in names and not any("/_lib/" in n for n in names)


def test_required_cuda_build_fails_without_nvcc(tmp_path):
    res, wheels = _build_wheel(tmp_path, {"PATH": _no_nvcc_path(), "FASTNF4_REQUIRE_CUDA_BUILD": "1"},
                               drop=("CUDA_HOME",))
    assert res.returncode != 0 and not wheels
    assert "FASTNF4_REQUIRE_CUDA_BUILD" in res.stdout + res.stderr


def _cuobjdump():
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
    except ImportError:
        return None
    bundled = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return bundled if os.path.exists(bundled) else None


def _listed(tool, lib, what) -> set[str]:
    res = subprocess.run([tool, f"--list-{what}", lib], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return set(re.findall(r"\.(sm_\d+a?)\.(?:cubin|ptx)", res.stdout))


def _check_real_libraries(manifest):
    """cuobjdump lists exactly the manifest's targets, and the libraries load (no GPU needed) and match the ctypes
    mirrors of their parameters."""
    from fastnf4.ops.matmul import gemv_mma, wgmma

    tool = _cuobjdump()
    for name, lib in manifest["_paths"].items():
        entry = manifest["libraries"][name]
        if tool is not None:
            assert _listed(tool, lib, "elf") == set(entry["sass"]), name
            assert _listed(tool, lib, "ptx") == {p.replace("compute_", "sm_") for p in entry["ptx"]}, name
        dll = ctypes.CDLL(lib)
        size = getattr(dll, f"fastnf4_{name}_params_size")
        size.restype = ctypes.c_int
        assert size() == ctypes.sizeof({"gemv_mma": gemv_mma.Params, "wgmma": wgmma.Params}[name])


@pytest.mark.skipif(bool(os.environ.get("FASTNF4_TEST_WHEEL")), reason="FASTNF4_TEST_WHEEL: the prebuilt wheel is checked")
@pytest.mark.skipif(_cuda.find_nvcc()[0] is None, reason="nvcc not installed")
def test_wheel_with_nvcc_for_sm90(tmp_path):
    """The real build, narrowed to sm_90 (a few minutes on two cores): both libraries, the targets cuobjdump
    lists, loadable."""
    res, wheels = _build_wheel(tmp_path, {"FASTNF4_CUDA_ARCHS": "90", "FASTNF4_REQUIRE_CUDA_BUILD": "1"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    manifest = _check_wheel(wheels[0], str(tmp_path / "x"))
    assert manifest["archs"] == ["sm_90"]
    assert manifest["libraries"]["gemv_mma"]["sass"] == ["sm_90"]
    assert manifest["libraries"]["gemv_mma"]["ptx"] == ["compute_90"]
    assert manifest["libraries"]["wgmma"]["sass"] == ["sm_90a"]
    _check_real_libraries(manifest)


@pytest.mark.skipif(not os.environ.get("FASTNF4_TEST_WHEEL"), reason="set FASTNF4_TEST_WHEEL to a built wheel")
def test_prebuilt_wheel(tmp_path):
    """A built wheel: both libraries with every target of the default architectures (or of FASTNF4_CUDA_ARCHS, as
    the wheel was built with)."""
    manifest = _check_wheel(os.environ["FASTNF4_TEST_WHEEL"], str(tmp_path / "x"))
    archs = _cuda.parse_archs(os.environ.get("FASTNF4_CUDA_ARCHS"))
    assert manifest["archs"] == [f"sm_{a}" for a in archs]
    for name, lib in _cuda.LIBRARIES.items():
        sass, ptx = _cuda.package_targets(lib, archs)
        if not sass:
            assert name not in manifest["libraries"]
            continue
        assert manifest["libraries"][name]["sass"] == sass and manifest["libraries"][name]["ptx"] == ptx
    _check_real_libraries(manifest)
