"""The JIT build cache of ``fastnf4/_cuda.py`` (nvcc -> shared library -> ctypes) is trusted with code that runs
in the user's process, so: it lives in a private folder (created 0700; a folder that others can write, or that
another user owns, is refused), every library is checked against the SHA-256 written beside it at build time
before ctypes loads it (a damaged or replaced library is rebuilt, never loaded), the cache key covers the
compiler's version and every flag, and no environment variable adds flags to the product build.

No real compile happens here: a fake ``nvcc`` (a shell script on PATH) writes a small file, and ``ctypes.CDLL`` is
replaced by a recorder of the bytes it was asked to load.
"""
from __future__ import annotations

import os
import stat
import sys
import threading
import types
import warnings

import pytest
import torch

from fastnf4 import _cuda

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")

FAKE_NVCC = r"""#!/bin/sh
# a stand-in for nvcc: --version names a release; a build logs its arguments and writes a small "library"
if [ "$1" = "--version" ]; then
  echo "nvcc: NVIDIA (R) Cuda compiler driver"
  echo "Cuda compilation tools, release 13.0, V13.0.${FAKE_NVCC_PATCH:-88}"
  exit 0
fi
echo "$*" >> "$FAKE_NVCC_LOG"
if [ -n "$FAKE_NVCC_FAIL" ]; then echo "fake nvcc: error" >&2; exit 1; fi
out=""
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ]; then out="$2"; fi
  shift
done
[ -n "$FAKE_NVCC_SLEEP" ] && sleep "$FAKE_NVCC_SLEEP"
printf 'fake library %s %s\n' "${FAKE_NVCC_PATCH:-88}" "$$" > "$out"
"""


def _forget():
    """Drop every per-process memo of the module (loaded libraries, compiler versions, manifest, warnings)."""
    forget = getattr(_cuda, "_forget", None)
    if forget is not None:
        forget()
    else:
        _cuda._load.cache_clear()


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A fake nvcc first on PATH, a fresh cache folder name (not created), CDLL recording what it loads."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nvcc = bin_dir / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    log = tmp_path / "nvcc.log"
    log.write_text("")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for name in ("FASTNF4_NVCC", "CUDA_HOME", "CUDA_PATH", "FASTNF4_NVCC_FLAGS", "FASTNF4_STRICT", "FASTNF4_CUDA",
                 "FAKE_NVCC_PATCH", "FAKE_NVCC_FAIL", "FAKE_NVCC_SLEEP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FAKE_NVCC_LOG", str(log))
    cache = tmp_path / "cache"
    monkeypatch.setenv("FASTNF4_CACHE", str(cache))
    src = tmp_path / "src" / "k.cu"
    src.parent.mkdir()
    src.write_text("extern \"C\" int k() { return 1; }\n")
    loaded: list[bytes] = []

    def cdll(path, *args, **kwargs):
        with open(path, "rb") as f:
            loaded.append(f.read())
        return types.SimpleNamespace(_name=path)

    monkeypatch.setattr("ctypes.CDLL", cdll)
    monkeypatch.setattr(_cuda, "device_arch", lambda index: "sm_90")
    _forget()
    yield types.SimpleNamespace(cache=cache, src=str(src), log=log, loaded=loaded, tmp=tmp_path)
    _forget()


def _builds(fake) -> list[str]:
    return [ln for ln in fake.log.read_text().splitlines() if ln.strip()]


def _load(fake):
    _forget()  # a new process, as far as the module's memos go
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _cuda.load(fake.src, torch.device("cuda", 0))


# --- a private folder ---------------------------------------------------------------------------------------------

def test_new_cache_folder_is_created_private(fake):
    _cuda.compile_source(fake.src, "sm_90")
    assert stat.S_IMODE(os.stat(fake.cache).st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722])
def test_cache_folder_writable_by_others_is_refused(fake, mode):
    fake.cache.mkdir()
    fake.cache.chmod(mode)
    with pytest.raises(RuntimeError, match="(?i)writ"):
        _cuda.compile_source(fake.src, "sm_90")
    assert _load(fake) is None and fake.loaded == []  # nothing loaded from it
    assert _builds(fake) == []  # and nothing written into it


def test_cache_folder_of_another_user_is_refused(fake, monkeypatch):
    fake.cache.mkdir(mode=0o700)
    real = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: real + 1)  # the folder now belongs to someone else
    with pytest.raises(RuntimeError, match="(?i)own"):
        _cuda.compile_source(fake.src, "sm_90")
    assert _load(fake) is None and fake.loaded == []


def test_cache_under_a_folder_everyone_can_write_is_refused(fake, monkeypatch):
    """Whoever can rename entries in a folder above the cache can swap the cache itself (unless the sticky bit
    keeps them to their own entries, as in /tmp)."""
    parent = fake.tmp / "open"
    parent.mkdir()
    parent.chmod(0o777)
    monkeypatch.setenv("FASTNF4_CACHE", str(parent / "cache"))
    with pytest.raises(RuntimeError, match="(?i)writ"):
        _cuda.compile_source(fake.src, "sm_90")
    parent.chmod(0o1777)  # sticky, like /tmp: accepted
    lib = _cuda.compile_source(fake.src, "sm_90")
    assert os.path.dirname(lib) == os.path.realpath(parent / "cache")


# --- verified before loading --------------------------------------------------------------------------------------

def test_planted_library_is_rebuilt_not_loaded(fake):
    """A library at the cache's name without (or against) its recorded hash: rebuilt, and the rebuilt one loaded."""
    lib = _cuda.compile_source(fake.src, "sm_90")
    with open(lib, "wb") as f:
        f.write(b"planted library")
    assert _load(fake) is not None
    assert fake.loaded and all(b.startswith(b"fake library") for b in fake.loaded)
    assert len(_builds(fake)) == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "hash", "no-hash"])
def test_damaged_cached_library_is_rebuilt(fake, damage):
    lib = _cuda.compile_source(fake.src, "sm_90")
    with open(lib, "rb") as f:
        good = f.read()
    sidecar = lib + ".sha256"
    if damage == "truncate":
        with open(lib, "r+b") as f:
            f.truncate(5)
    elif damage == "flip":
        with open(lib, "r+b") as f:
            f.write(bytes([good[0] ^ 1]))
    elif damage == "hash":
        with open(sidecar, "w") as f:
            f.write("0" * 64 + "\n")
    else:
        os.unlink(sidecar)
    assert _load(fake) is not None
    assert len(fake.loaded) == 1 and fake.loaded[0].startswith(b"fake library")
    assert len(_builds(fake)) == 2  # rebuilt
    assert _cuda.compile_source(fake.src, "sm_90") == lib and len(_builds(fake)) == 2  # and now reused


def test_verified_library_is_reused(fake):
    lib = _cuda.compile_source(fake.src, "sm_90")
    assert _load(fake) is not None and _cuda.compile_source(fake.src, "sm_90") == lib
    assert len(_builds(fake)) == 1


def test_concurrent_builders_agree(fake, monkeypatch):
    """Builders of one key at once (threads here; separate processes take the same file lock): each returns a
    library that matches its recorded hash."""
    monkeypatch.setenv("FAKE_NVCC_SLEEP", "0.3")
    paths, errors = [], []

    def build():
        try:
            paths.append(_cuda.compile_source(fake.src, "sm_90"))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(paths)) == 1
    import hashlib

    with open(paths[0], "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    with open(paths[0] + ".sha256") as f:
        assert f.read().split()[0] == digest
    assert len(_builds(fake)) == 1  # the others waited for the first build
    assert [n for n in os.listdir(fake.cache) if not n.endswith((".so", ".sha256", ".lock"))] == []  # no leftovers


# --- the cache key ------------------------------------------------------------------------------------------------

def test_cache_key_covers_compiler_version(fake, monkeypatch):
    first = _cuda.compile_source(fake.src, "sm_90")
    monkeypatch.setenv("FAKE_NVCC_PATCH", "99")  # another nvcc release at the same path
    _forget()
    second = _cuda.compile_source(fake.src, "sm_90")
    assert first != second and len(_builds(fake)) == 2


def test_cache_key_covers_fixed_flags(fake, monkeypatch):
    first = _cuda.compile_source(fake.src, "sm_90")
    flags = tuple(getattr(_cuda, "FLAGS", ("-O3", "-std=c++17", "-Xcompiler", "-fPIC", "--shared")))
    monkeypatch.setattr(_cuda, "FLAGS", tuple(f if f != "-O3" else "-O2" for f in flags), raising=False)
    second = _cuda.compile_source(fake.src, "sm_90")
    assert first != second
    assert "-O2" in _builds(fake)[-1]  # and the flags the key names are the ones used


def test_cache_key_covers_extra_flags_and_arch(fake):
    libs = {_cuda.compile_source(fake.src, "sm_90"), _cuda.compile_source(fake.src, "sm_80"),
            _cuda.compile_source(fake.src, "sm_90", extra=("-DX=1",))}
    assert len(libs) == 3


def test_environment_adds_no_flags_to_the_product_build(fake, monkeypatch):
    monkeypatch.setenv("FASTNF4_NVCC_FLAGS", "-DFASTNF4_EVIL=1 -G")
    assert _load(fake) is not None
    assert _builds(fake) and all("FASTNF4_EVIL" not in b and " -G" not in b for b in _builds(fake))


def test_failed_build_leaves_nothing_behind(fake, monkeypatch):
    monkeypatch.setenv("FAKE_NVCC_FAIL", "1")
    with pytest.raises(RuntimeError, match="nvcc failed"):
        _cuda.compile_source(fake.src, "sm_90")
    assert [n for n in os.listdir(fake.cache) if not n.endswith(".lock")] == []
