"""fastnf4's CUDA libraries: shipped prebuilt in the wheel, else built with nvcc on first use; loaded with ctypes.

fastnf4 is Triton first; a kernel lives in CUDA only where Triton cannot express what pays (the decode-size
tensor-core matmul needs a per-lane shared-memory table and hand-placed ``mma.sync`` fragments). The CUDA sources
are plain CUDA C (no PyTorch headers), so a library does not depend on the torch version.

Where a library comes from, in this order (``load``):

1. **packaged**: ``fastnf4/_lib/lib<name>.so``, built when the wheel was built (``setup.py``), described by
   ``fastnf4/_lib/manifest.json`` (compiler, CUDA version, the SASS / PTX targets of each library, the SHA-256 of
   each library and of the source it was built from). It is used when it has code for the device (SASS for the
   exact architecture, or, for a library without arch-specific code, PTX that the driver can compile for it at the
   same feature level: ``Library.levels``), was built from the very source text next to it, the driver supports
   the CUDA version it was built with, and the file matches the manifest's hash (checked just before ctypes
   loads it: a damaged or replaced file is refused).
2. **jit-cache**: built with nvcc (``$FASTNF4_NVCC``, else ``$CUDA_HOME/bin/nvcc``, else ``nvcc`` on PATH) into
   ``$FASTNF4_CACHE`` (default ``~/.cache/fastnf4``). The cache runs code in the user's process, so it is kept
   private: created 0700; a folder that is not owned by the user, that group or others can write, or that sits
   below a folder another user owns or everyone can write (without the sticky bit, as /tmp has) is refused. A
   library is keyed by the source text (with the local headers it includes), the target, the ``nvcc --version``
   output and every flag; the SHA-256 of each build is written beside it and checked before every load (a
   mismatch is rebuilt, never loaded). Builders of one key take a file lock, and a build is published by atomic
   renames, so concurrent processes never see a half-written library.
3. **unavailable**: the callers fall back to the Triton kernels, and fastnf4 says so once per library (which
   kernels, why, what to do); ``FASTNF4_STRICT=1`` makes that a RuntimeError (CI, benchmarks).

``FASTNF4_CUDA=0`` turns the CUDA kernels off (no warning). No environment variable adds flags to these builds:
experiments build their own copies with ``compile_source(..., extra=...)``. ``status(device)`` reports where each
library comes from (``fastnf4 doctor``).

This module imports only the standard library at import time (``setup.py`` loads it to build the wheel's libraries
with the same flags and targets); torch is imported where a device is asked about.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import threading
import warnings

try:
    import fcntl
except ImportError:  # not POSIX: builders are not serialised, each publish is still atomic
    fcntl = None  # type: ignore[assignment]

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
PACKAGED_DIR = os.path.join(PACKAGE_DIR, "_lib")  # the wheel's prebuilt libraries and manifest.json
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
# nvcc flags of every build (JIT and wheel), besides the -gencode targets; part of the cache key
FLAGS = ("-O3", "-std=c++17", "-Xcompiler", "-fPIC", "--shared")
# the architectures a wheel carries SASS for unless FASTNF4_CUDA_ARCHS narrows them (A100/A30, A10/3090, L4/L40/4090,
# H100/H200); newer GPUs run the PTX of the gemv library
DEFAULT_ARCHS = (80, 86, 89, 90)


@dataclasses.dataclass(frozen=True)
class Library:
    """One CUDA library of the product."""

    name: str  # the source's stem and the library's (lib<name>.so)
    source: str  # relative to the package folder
    suffix: str  # "a": built for the arch-specific target (sm_90a), SASS only
    min_cc: int  # the compute capabilities it is for (major * 10 + minor)
    max_cc: int | None
    # the __CUDA_ARCH__ thresholds the device code branches on: PTX for a device must come from an architecture at
    # the device's level (gemv_mma.cu's PDL waits and cluster barriers exist from 900 on; the host asks for them
    # on sm_90+, so sm_80 PTX run on a Hopper-or-newer GPU would race or trap)
    levels: tuple[int, ...]
    kernels: str  # what runs on it, for messages

    def applies(self, cc: int) -> bool:
        return cc >= self.min_cc and (self.max_cc is None or cc <= self.max_cc)

    def where(self) -> str:
        if self.max_cc == self.min_cc:
            return f"sm_{self.min_cc}{self.suffix} GPUs"
        return f"sm_{self.min_cc}+ GPUs"


LIBRARIES = {
    "gemv_mma": Library("gemv_mma", "ops/matmul/gemv_mma.cu", "", 80, None, (80, 90),
                        "the decode-size (M <= 32) tensor-core NF4 matmuls"),
    "wgmma": Library("wgmma", "ops/matmul/wgmma.cu", "a", 90, 90, (90,),
                     "the Hopper wgmma NF4 matmul for batch and prefill sizes (M > 2)"),
}

_lock = threading.RLock()
_loaded: dict[tuple[str, str], object] = {}  # (source, arch) -> ctypes.CDLL or None (unavailable)
_records: dict[tuple[str, str], dict] = {}  # (source, arch) -> where it came from (status)
_warned: set[str] = set()  # libraries already reported unavailable in this process
_memo: dict[tuple, object] = {}  # compiler versions, the manifest, the driver's CUDA version


class NoCompilerError(RuntimeError):
    """No usable nvcc."""


class UnsafeCacheError(RuntimeError):
    """A build-cache folder that others could write into (or that another user owns)."""


class BuildError(RuntimeError):
    """nvcc failed."""


def _forget() -> None:
    """Drop every per-process memo (loaded libraries, compiler versions, the manifest, warnings given); tests."""
    with _lock:
        _loaded.clear()
        _records.clear()
        _warned.clear()
        _memo.clear()


def disabled() -> bool:
    """``FASTNF4_CUDA=0``: the CUDA kernels are off."""
    return os.environ.get("FASTNF4_CUDA", "1") == "0"


def strict() -> bool:
    """``FASTNF4_STRICT=1``: a CUDA library that is unavailable for a CUDA device is an error, not a warning."""
    return os.environ.get("FASTNF4_STRICT", "0") not in ("", "0")


def cache_dir() -> str:
    return os.environ.get("FASTNF4_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "fastnf4")


# --- the compiler -------------------------------------------------------------------------------------------------

def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_nvcc() -> tuple[str | None, str]:
    """(nvcc, "") or (None, why not): ``$FASTNF4_NVCC``, else ``$CUDA_HOME/bin/nvcc``, else ``nvcc`` on PATH. An
    explicit ``FASTNF4_NVCC`` that is not an executable is not replaced by another compiler."""
    explicit = os.environ.get("FASTNF4_NVCC")
    if explicit:
        if _executable(explicit):
            return os.path.abspath(explicit), ""
        return None, f"FASTNF4_NVCC={explicit} is not an executable file"
    home = os.environ.get("CUDA_HOME")
    if home and _executable(os.path.join(home, "bin", "nvcc")):
        return os.path.join(home, "bin", "nvcc"), ""
    found = shutil.which("nvcc")
    if found:
        return found, ""
    return None, "no nvcc (looked at FASTNF4_NVCC, $CUDA_HOME/bin/nvcc and PATH)"


def nvcc_version(nvcc: str) -> str:
    """The full ``nvcc --version`` output (memoised per file and modification time)."""
    st = os.stat(nvcc)
    key = ("nvcc", os.path.abspath(nvcc), st.st_mtime_ns, st.st_size)
    if key not in _memo:
        try:
            res = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise NoCompilerError(f"{nvcc} --version failed ({e})") from e
        if res.returncode != 0 or not res.stdout.strip():
            raise NoCompilerError(f"{nvcc} --version failed (exit {res.returncode}): {res.stderr.strip()[-500:]}")
        _memo[key] = res.stdout.strip()
    return _memo[key]  # type: ignore[return-value]


def cuda_release(version_text: str) -> str | None:
    """"13.0" from ``nvcc --version`` output."""
    m = re.search(r"release (\d+)\.(\d+)", version_text)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def _release_number(release: str) -> int:
    """"12.4" -> 12040 (cuDriverGetVersion's encoding)."""
    major, minor = release.split(".")[:2]
    return int(major) * 1000 + int(minor) * 10


def fat_gencode(sass: list[str], ptx: list[str]) -> list[str]:
    """nvcc flags for one library with SASS for each ``sm_XY`` of ``sass`` and PTX for each ``compute_XY`` of
    ``ptx`` (the driver compiles the PTX for newer GPUs). ``fat_gencode([arch], [])``: one target, SASS only (the
    JIT build)."""
    flags = [f"-gencode=arch=compute_{a.split('_', 1)[1]},code={a}" for a in sass]
    flags += [f"-gencode=arch={p},code={p}" for p in ptx]
    return flags


def parse_archs(text: str | None) -> tuple[int, ...]:
    """``FASTNF4_CUDA_ARCHS`` ("80;86;89;90", "8.0 9.0", "sm_90", ...) -> (80, 86, 89, 90); unset or empty: the
    defaults; "none": no CUDA libraries. Below 80 is refused (the kernels need Ampere)."""
    if text is None or not text.strip():
        return DEFAULT_ARCHS
    if text.strip().lower() in ("none", "off", "0"):
        return ()
    archs = []
    for item in re.split(r"[;,\s]+", text.strip()):
        if not item:
            continue
        raw = item.lower().removeprefix("sm_").removeprefix("compute_").rstrip("a")
        if re.fullmatch(r"\d+\.\d", raw):
            raw = raw.replace(".", "")
        if not raw.isdigit() or int(raw) < 80:
            raise ValueError(f"FASTNF4_CUDA_ARCHS: {item!r} is not a CUDA architecture of 80 (sm_80) or newer")
        if int(raw) not in archs:
            archs.append(int(raw))
    return tuple(sorted(archs))


def package_targets(lib: Library, archs: tuple[int, ...]) -> tuple[list[str], list[str]]:
    """(SASS targets, PTX targets) of ``lib`` in a wheel for ``archs``: SASS for each architecture it applies to;
    for a library without arch-specific code also the PTX of the lowest listed architecture at each of its
    feature levels (so newer GPUs get PTX of their own level: gemv_mma sm_80..89 -> compute_80, sm_90+ ->
    compute_90)."""
    mine = [a for a in archs if lib.applies(a)]
    sass = [f"sm_{a}{lib.suffix}" for a in mine]
    if lib.suffix:
        return sass, []
    groups: dict[int, list[int]] = {}
    for a in mine:
        groups.setdefault(max(lv for lv in lib.levels if lv <= a), []).append(a)
    return sass, [f"compute_{min(g)}" for _, g in sorted(groups.items())]


def covers(entry: dict, arch: str, lib: Library) -> bool:
    """Whether a manifest entry has code for ``arch`` (``sm_90`` / ``sm_90a``): SASS for exactly it, or (not for an
    arch-specific target) PTX of an architecture <= the device's and at the device's feature level."""
    if arch in entry.get("sass", ()):
        return True
    number = arch.split("_", 1)[1]
    if not number.isdigit():
        return False
    cc = int(number)
    below = [int(p[8:]) for p in entry.get("ptx", ()) if p.startswith("compute_") and p[8:].isdigit()
             and int(p[8:]) <= cc]
    if not below:
        return False
    level = max((lv for lv in lib.levels if lv <= cc), default=0)
    return max(below) >= level


# --- sources and files --------------------------------------------------------------------------------------------

_LOCAL_INCLUDE = re.compile(rb'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def _source_bytes(source: str, seen: set[str] | None = None) -> bytes:
    """The text of ``source`` followed by that of every header it includes with quotes from its own folder (and
    theirs), so that a change in such a header changes the cache key; a source without them hashes as itself."""
    seen = set() if seen is None else seen
    seen.add(os.path.abspath(source))
    with open(source, "rb") as f:
        text = f.read()
    for name in _LOCAL_INCLUDE.findall(text):
        header = os.path.join(os.path.dirname(os.path.abspath(source)), name.decode())
        if os.path.isfile(header) and os.path.abspath(header) not in seen:
            text += _source_bytes(header, seen)
    return text


def source_sha256(source: str) -> str:
    return hashlib.sha256(_source_bytes(source)).hexdigest()


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _key(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:  # length-prefixed: no two different part lists hash alike
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()[:20]


# --- the private build cache --------------------------------------------------------------------------------------

def private_dir(path: str) -> str:
    """``path`` created 0700 if missing, checked, and returned resolved (later file operations use the resolved
    folder, so a symbolic link swapped after the check does not redirect them). Refused (UnsafeCacheError): a
    folder owned by another user or writable by group or others, or one below a folder that another user (not
    root) owns or that everyone can write without the sticky bit."""
    path = os.path.abspath(os.path.expanduser(path))
    try:
        os.makedirs(path, mode=0o700)
    except FileExistsError:
        pass
    real = os.path.realpath(path)
    st = os.stat(real)
    me = os.geteuid()
    fix = "make it private (owned by you, chmod 700) or set FASTNF4_CACHE to a private folder"
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeCacheError(f"the build cache {real} is not a folder")
    if st.st_uid != me:
        raise UnsafeCacheError(f"the build cache {real} is owned by another user (uid {st.st_uid}, you are {me}): "
                               f"refused; {fix}")
    if st.st_mode & 0o022:
        who = "group and others" if st.st_mode & 0o022 == 0o022 else ("others" if st.st_mode & 0o002 else "group")
        raise UnsafeCacheError(f"the build cache {real} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o}): "
                               f"refused; {fix}")
    parent = os.path.dirname(real)
    while True:
        pst = os.stat(parent)
        if pst.st_uid not in (0, me):
            raise UnsafeCacheError(f"the build cache {real} is inside {parent}, owned by another user "
                                   f"(uid {pst.st_uid}): refused; {fix}")
        if pst.st_mode & 0o002 and not pst.st_mode & stat.S_ISVTX:
            raise UnsafeCacheError(f"the build cache {real} is inside {parent}, writable by everyone without the "
                                   f"sticky bit: refused; {fix}")
        if os.path.dirname(parent) == parent:
            return real
        parent = os.path.dirname(parent)


@contextlib.contextmanager
def _file_lock(path: str):
    """An exclusive lock on ``path`` (created 0600) while the block runs: one builder per cache entry."""
    if fcntl is None:
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass  # a file system without locks: builders may both build; each publish is still atomic
        yield
    finally:
        os.close(fd)


def _recorded_sha256(lib: str) -> str | None:
    try:
        with open(lib + ".sha256") as f:
            words = f.read(200).split()
    except OSError:
        return None
    return words[0] if words and re.fullmatch(r"[0-9a-f]{64}", words[0]) else None


def _verified(lib: str) -> bool | None:
    """None: no library there; True: a regular file that matches the SHA-256 recorded beside it; False: anything
    else (damaged, replaced, no or a malformed record)."""
    try:
        st = os.lstat(lib)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return False
    want = _recorded_sha256(lib)
    return want is not None and sha256_file(lib) == want


def _cache_entry(source: str, arch: str, nvcc: str, folder: str, extra: tuple[str, ...]) -> tuple[str, list[str]]:
    """(library path in ``folder``, nvcc arguments) of a build: the name's key covers the source text (with its local
    headers), the target, the compiler's version output and every flag."""
    args = [*fat_gencode([arch], []), *FLAGS, *extra]
    tag = _key(_source_bytes(source), arch.encode(), nvcc_version(nvcc).encode(), "\0".join(args).encode())
    stem = os.path.splitext(os.path.basename(source))[0]
    return os.path.join(folder, f"lib{stem}-{arch}-{tag}.so"), args


def _build(nvcc: str, source: str, args: list[str], lib: str) -> None:
    """nvcc into a temporary file beside ``lib``, its SHA-256 recorded, both published by atomic renames (the
    library first: a crash in between leaves a mismatch, which is rebuilt)."""
    folder = os.path.dirname(lib)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=folder)
    os.close(fd)
    record = None
    try:
        res = subprocess.run([nvcc, *args, "-o", tmp, source], capture_output=True, text=True)
        if res.returncode != 0:
            raise BuildError(f"nvcc failed on {source}:\n{(res.stderr or res.stdout)[-4000:]}")
        digest = sha256_file(tmp)
        fd, record = tempfile.mkstemp(prefix=".build-", suffix=".sha256", dir=folder)
        with os.fdopen(fd, "w") as f:
            f.write(f"{digest}  {os.path.basename(lib)}\n")
        os.replace(tmp, lib)
        os.replace(record, lib + ".sha256")
    finally:
        for path in (tmp, record):
            if path is not None and os.path.exists(path):
                os.unlink(path)


def compile_source(source: str, arch: str, out_dir: str | None = None, extra: tuple[str, ...] = ()) -> str:
    """The path of ``source`` built for ``arch`` (``sm_90``, ``sm_90a``) in the private folder ``out_dir`` (default
    ``cache_dir()``), built now unless a library of the same key is there and matches its recorded SHA-256.
    ``extra``: more nvcc flags (experiments; part of the key). Raises NoCompilerError, UnsafeCacheError or
    BuildError (all RuntimeError)."""
    nvcc, why = find_nvcc()
    if nvcc is None:
        raise NoCompilerError(why)
    folder = private_dir(out_dir or cache_dir())
    lib, args = _cache_entry(source, arch, nvcc, folder, tuple(extra))
    with _file_lock(lib + ".lock"):
        state = _verified(lib)
        if state:
            return lib
        if state is False:
            warnings.warn(f"fastnf4: the cached library {lib} does not match its recorded SHA-256 (damaged or "
                          "replaced); rebuilding it", RuntimeWarning, stacklevel=2)
        _build(nvcc, source, args, lib)
    return lib


# --- the packaged libraries ---------------------------------------------------------------------------------------

def _manifest() -> tuple[dict | None, str]:
    """(the wheel's manifest, "") or (None, why there is none)."""
    path = os.path.join(PACKAGED_DIR, MANIFEST)
    key = ("manifest", path)
    if key not in _memo:
        try:
            with open(path) as f:
                m = json.load(f)
            if m.get("format") != MANIFEST_FORMAT or not isinstance(m.get("libraries"), dict):
                _memo[key] = (None, f"{path} has an unknown format")
            else:
                _memo[key] = (m, "")
        except FileNotFoundError:
            _memo[key] = (None, "this fastnf4 has no prebuilt CUDA libraries (a source checkout, or a wheel built "
                                "without nvcc)")
        except (OSError, ValueError) as e:
            _memo[key] = (None, f"{path} is unreadable ({e})")
    return _memo[key]  # type: ignore[return-value]


def _driver_cuda_version() -> int | None:
    """The CUDA version the driver supports (cuDriverGetVersion: 13000 = 13.0), None where unknown."""
    if "driver" not in _memo:
        version = None
        try:
            libcuda = ctypes.CDLL("libcuda.so.1")
            v = ctypes.c_int(0)
            if libcuda.cuDriverGetVersion(ctypes.byref(v)) == 0:
                version = v.value
        except (OSError, AttributeError):
            pass
        _memo["driver"] = version
    return _memo["driver"]  # type: ignore[return-value]


class _Refused(str):
    """A reason that a packaged library exists for the device but failed its hash check (damage or tampering):
    worth a warning even when the JIT build stands in."""


def _packaged(lib: Library, source: str, arch: str) -> tuple[str | None, str]:
    """(path of the packaged library, "") when it may be loaded for ``arch`` (its hash checked now), else (None,
    why not)."""
    m, why = _manifest()
    if m is None:
        return None, why
    entry = m["libraries"].get(lib.name)
    if entry is None:
        missing = m.get("missing", {}).get(lib.name)
        return None, f"the wheel was built without lib{lib.name}.so" + (f" ({missing})" if missing else "")
    name = entry.get("file", "")
    if not name or os.path.basename(name) != name:
        return None, f"the manifest names a bad file for {lib.name}: {name!r}"
    if not covers(entry, arch, lib):
        return None, (f"the prebuilt {name} has no code for {arch} (SASS {', '.join(entry.get('sass', [])) or '-'}; "
                      f"PTX {', '.join(entry.get('ptx', [])) or '-'})")
    try:
        if entry.get("source_sha256") != source_sha256(source):
            return None, f"the prebuilt {name} was built from another version of {os.path.basename(source)}"
    except OSError as e:
        return None, f"cannot read {source} ({e})"
    need = m.get("min_driver_cuda")
    driver = _driver_cuda_version()
    if need and driver is not None and driver < _release_number(need):
        return None, (f"the NVIDIA driver supports CUDA {driver // 1000}.{driver % 1000 // 10}, the prebuilt "
                      f"libraries need CUDA {need} (update the driver)")
    path = os.path.join(PACKAGED_DIR, name)
    try:
        ok = sha256_file(path) == entry.get("sha256")
    except OSError as e:
        return None, f"the prebuilt {name} is unreadable ({e})"
    if not ok:
        return None, _Refused(f"the prebuilt {path} does not match the manifest's SHA-256 (damaged or replaced): "
                              "refused")
    return path, ""


# --- loading ------------------------------------------------------------------------------------------------------

def device_arch(index: int) -> str:
    import torch

    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


def _cc(arch: str) -> int:
    return int(re.sub(r"\D", "", arch.split("_", 1)[1]))


def _advice(errors: list[BaseException], arch: str) -> str:
    if any(isinstance(e, UnsafeCacheError) for e in errors):
        return "make the build cache private (chmod 700, owned by you) or set FASTNF4_CACHE to a private folder"
    if any(isinstance(e, NoCompilerError) for e in errors):
        return (f"install a fastnf4 wheel built with CUDA libraries for {arch}, or the CUDA toolkit so that nvcc can "
                "build them on first use (FASTNF4_NVCC, $CUDA_HOME/bin/nvcc or nvcc on PATH)")
    if any(isinstance(e, BuildError) for e in errors):
        return "check the nvcc error above (a CUDA toolkit of 12.0 or newer is needed), or install a prebuilt wheel"
    return "see the reasons above; `fastnf4 doctor` reports each library's state"


def _unavailable(lib_name: str, arch: str, reasons: list[str], errors: list[BaseException]) -> None:
    lib = LIBRARIES.get(lib_name)
    what = f"lib{lib_name} ({lib.kernels})" if lib else f"lib{lib_name}"
    msg = (f"fastnf4: the CUDA kernels of {what} are unavailable on this {arch} GPU, so those calls take the "
           f"slower Triton kernels. Why: {'; '.join(r[:2000] for r in reasons)}. To fix: {_advice(errors, arch)}. "
           "(FASTNF4_STRICT=1 makes this an error; FASTNF4_CUDA=0 turns the CUDA kernels off without this warning.)")
    if strict():
        raise RuntimeError(msg)
    if lib_name not in _warned:
        _warned.add(lib_name)
        warnings.warn(msg, RuntimeWarning, stacklevel=4)


def _load(source: str, arch: str):
    key = (source, arch)
    if key in _loaded:
        return _loaded[key]
    name = os.path.splitext(os.path.basename(source))[0]
    lib = LIBRARIES.get(name)
    reasons: list[str] = []
    errors: list[BaseException] = []
    if lib is not None:
        path, why = _packaged(lib, source, arch)
        if path is not None:
            try:
                dll = ctypes.CDLL(path)  # hash checked just now
                _records[key] = {"source": "packaged", "path": path, "reason": ""}
                _loaded[key] = dll
                return dll
            except OSError as e:
                reasons.append(f"the prebuilt {os.path.basename(path)} failed to load ({e})")
                errors.append(e)
        else:
            reasons.append(why)
            if isinstance(why, _Refused) and f"refused:{name}" not in _warned:
                _warned.add(f"refused:{name}")
                warnings.warn(f"fastnf4: {why}", RuntimeWarning, stacklevel=4)
    try:
        path = compile_source(source, arch)
        dll = ctypes.CDLL(path)
        _records[key] = {"source": "jit-cache", "path": path, "reason": "; ".join(reasons)}
        _loaded[key] = dll
        return dll
    except (RuntimeError, OSError) as e:
        reasons.append(str(e))
        errors.append(e)
    _records[key] = {"source": "unavailable", "path": None, "reason": "; ".join(reasons)}
    _unavailable(name, arch, reasons, errors)  # raises in strict mode (nothing cached: the next call tries again)
    _loaded[key] = None
    return None


def load(source: str, device, arch_suffix: str = "") -> ctypes.CDLL | None:
    """The library of ``source`` for the CUDA ``device`` (packaged, else from the JIT cache, built now if needed),
    or None: not a CUDA device, ``FASTNF4_CUDA=0``, a product library not meant for this GPU, or unavailable (then
    a warning once per library, or a RuntimeError with ``FASTNF4_STRICT=1``). ``arch_suffix`` "a": the
    architecture-specific target (``sm_90a``: wgmma)."""
    if device.type != "cuda" or disabled():
        return None
    if device.index is not None:
        index = device.index
    else:
        import torch

        index = torch.cuda.current_device()
    arch = device_arch(index) + arch_suffix
    lib = LIBRARIES.get(os.path.splitext(os.path.basename(source))[0])
    if lib is not None and not lib.applies(_cc(arch)):
        return None
    with _lock:
        return _load(os.path.realpath(source), arch)


def status(device=None) -> dict:
    """Where each product library comes from on ``device`` (default: the current CUDA device), without building
    anything: ``libraries[name]["source"]`` is "packaged", "jit-cache" (built and verified in the cache),
    "jit-pending" (nvcc builds it on first use), "unavailable", "disabled" (FASTNF4_CUDA=0) or "not-applicable",
    with ``reason``, ``path`` and ``loaded`` (in this process). Also the compiler, the cache, the driver's CUDA
    version and the wheel's manifest summary."""
    import torch

    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    nvcc, nvcc_why = find_nvcc()
    m, m_why = _manifest()
    out: dict = {
        "device": str(device), "arch": None, "enabled": not disabled(), "strict": strict(),
        "nvcc": nvcc, "nvcc_problem": nvcc_why or None, "nvcc_release": None,
        "cache": cache_dir(), "cache_problem": None, "driver_cuda": None,
        "packaged": {"dir": PACKAGED_DIR, "manifest": m is not None, "problem": m_why or None,
                     "cuda": (m or {}).get("cuda_version"), "min_driver_cuda": (m or {}).get("min_driver_cuda")},
        "libraries": {},
    }
    if nvcc is not None:
        try:
            out["nvcc_release"] = cuda_release(nvcc_version(nvcc))
        except NoCompilerError as e:
            nvcc, out["nvcc_problem"] = None, str(e)
    folder = None
    try:
        folder = private_dir(cache_dir())
    except (UnsafeCacheError, OSError) as e:
        out["cache_problem"] = str(e)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        out["arch"] = device_arch(index)
        driver = _driver_cuda_version()
        out["driver_cuda"] = f"{driver // 1000}.{driver % 1000 // 10}" if driver else None
    for name, lib in LIBRARIES.items():
        source = os.path.realpath(os.path.join(PACKAGE_DIR, lib.source))
        arch = out["arch"] + lib.suffix if out["arch"] else None
        rec: dict = {"kernels": lib.kernels, "arch": arch, "source": "unavailable", "path": None, "reason": "",
                     "loaded": False}
        if disabled():
            rec.update(source="disabled", reason="FASTNF4_CUDA=0")
        elif arch is None:
            rec.update(source="not-applicable", reason="not a CUDA device")
        elif not lib.applies(_cc(arch)):
            rec.update(source="not-applicable", reason=f"lib{name} is for {lib.where()}")
        elif (source, arch) in _records:
            rec.update(_records[(source, arch)], loaded=_loaded.get((source, arch)) is not None)
        else:
            path, why = _packaged(lib, source, arch)
            if path is not None:
                rec.update(source="packaged", path=path)
            elif nvcc is None:
                rec.update(reason=f"{why}; {out['nvcc_problem']}")
            elif folder is None:
                rec.update(reason=f"{why}; {out['cache_problem']}")
            else:
                cached, _ = _cache_entry(source, arch, nvcc, folder, ())
                if _verified(cached):
                    rec.update(source="jit-cache", path=cached, reason=why)
                else:
                    rec.update(source="jit-pending", path=cached,
                               reason=f"{why}; nvcc builds it on first use (a minute or two)")
        out["libraries"][name] = rec
    return out
