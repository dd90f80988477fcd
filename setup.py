"""fastnf4's build: the project's metadata is in pyproject.toml; this file adds the CUDA libraries to the wheel.

When a wheel is built (``pip wheel .``, ``python -m build``), ``fastnf4/ops/matmul/gemv_mma.cu`` is compiled into
``fastnf4/_lib/libgemv_mma.so`` (SASS for each architecture, PTX for newer GPUs) and ``wgmma.cu`` into
``fastnf4/_lib/libwgmma.so`` (sm_90a), both by one nvcc call each, run side by side (``--threads 0`` compiles a
library's targets in parallel), and ``fastnf4/_lib/manifest.json`` records the compiler, its CUDA version (the
oldest driver CUDA version the libraries run with), each library's targets and the SHA-256 of each library and of
its source. At run time ``fastnf4/_cuda.py`` loads these when they have code for the GPU and match their hashes,
else builds the shipped sources with nvcc on first use. The wheel is then tagged ``py3-none-<platform>``; without
libraries it stays ``py3-none-any``. Editable installs build no libraries (nvcc builds them on first use).

Build-time environment:

* ``FASTNF4_NVCC``: the nvcc to use; else ``$CUDA_HOME/bin/nvcc``; else ``nvcc`` on PATH.
* ``FASTNF4_CUDA_ARCHS``: the GPU architectures to carry SASS for, e.g. ``"90"`` or ``"80;86;89;90"`` (the
  default; separators ``;``, ``,`` or spaces; ``8.0`` and ``sm_80`` also accepted). libgemv_mma gets SASS for each
  and the PTX of the lowest listed architecture of each feature level (sm_80..89 -> compute_80, sm_90 and newer ->
  compute_90), which newer GPUs compile at load; libwgmma is built when 90 is listed. ``"none"``: no libraries.
* ``FASTNF4_REQUIRE_CUDA_BUILD=1``: a library that cannot be built (no nvcc, an nvcc error, ``none``) fails the
  build instead of leaving it out with a warning (release builds).
"""
from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))


def _rules():
    """fastnf4/_cuda.py as a standalone module (standard library only at import): the same flags, targets and
    compiler lookup as the run-time builds."""
    name = "_fastnf4_cuda_rules"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, "fastnf4", "_cuda.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")  # one write: the two builds' threads report without interleaving lines
    sys.stderr.flush()


def _loud(text: str) -> None:
    bar = "!" * 100
    _say(f"\n{bar}\n{text}\n{bar}\n")


def _required() -> bool:
    return os.environ.get("FASTNF4_REQUIRE_CUDA_BUILD", "0") not in ("", "0")


def build_cuda_libraries(out_dir: str) -> list[str]:
    """The wheel's CUDA libraries and manifest in ``out_dir`` (emptied first); returns the files written."""
    rules = _rules()
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    archs = rules.parse_archs(os.environ.get("FASTNF4_CUDA_ARCHS"))
    advice = ("an installed fastnf4 then needs nvcc at first use to build its CUDA kernels, and without it runs the "
              "slower Triton kernels only")
    if not archs:
        text = f"fastnf4: FASTNF4_CUDA_ARCHS=none: this wheel has NO prebuilt CUDA libraries; {advice}."
        if _required():
            raise RuntimeError(text + " (FASTNF4_REQUIRE_CUDA_BUILD=1)")
        _loud(text)
        return []
    nvcc, why = rules.find_nvcc()
    version = None
    if nvcc is not None:
        try:
            version = rules.nvcc_version(nvcc)
        except RuntimeError as e:  # there, but it does not run
            nvcc, why = None, str(e)
    if nvcc is None:
        text = (f"fastnf4: this wheel has NO prebuilt CUDA libraries: {why}. Set FASTNF4_NVCC or CUDA_HOME, or put "
                f"nvcc on PATH, to build them; {advice}. FASTNF4_REQUIRE_CUDA_BUILD=1 makes this an error.")
        if _required():
            raise RuntimeError(text)
        _loud(text)
        return []
    release = rules.cuda_release(version)
    jobs, missing = [], {}
    for name, lib in rules.LIBRARIES.items():
        sass, ptx = rules.package_targets(lib, archs)
        if not sass:
            missing[name] = f"FASTNF4_CUDA_ARCHS lists no architecture for it (it is for {lib.where()})"
            continue
        jobs.append((name, lib, os.path.join(HERE, "fastnf4", *lib.source.split("/")), sass, ptx))
    os.makedirs(out_dir)
    _say(f"fastnf4: building CUDA libraries with {nvcc} (CUDA {release}) for "
         f"{', '.join(f'sm_{a}' for a in archs)}: " + ", ".join(f"lib{j[0]}.so" for j in jobs) + " (minutes)")

    def build(job):
        name, lib, source, sass, ptx = job
        final = os.path.join(out_dir, f"lib{name}.so")
        tmp = final + ".tmp"
        cmd = [nvcc, *rules.fat_gencode(sass, ptx), *rules.FLAGS, "--threads", "0", "-o", tmp, source]
        start = time.monotonic()
        res = subprocess.run(cmd, capture_output=True, text=True)
        took = time.monotonic() - start
        if res.returncode != 0:
            if os.path.exists(tmp):
                os.unlink(tmp)
            return name, None, f"nvcc failed ({took:.0f} s):\n{(res.stderr or res.stdout)[-4000:]}"
        os.replace(tmp, final)
        entry = {"file": os.path.basename(final), "source": lib.source, "source_sha256": rules.source_sha256(source),
                 "sass": sass, "ptx": ptx, "sha256": rules.sha256_file(final), "bytes": os.path.getsize(final),
                 "gencode": rules.fat_gencode(sass, ptx), "seconds": round(took, 1)}
        _say(f"fastnf4: lib{name}.so: SASS {', '.join(sass)}; PTX {', '.join(ptx) or '-'}; "
             f"{entry['bytes'] / 2**20:.1f} MiB in {took:.0f} s")
        return name, entry, ""

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        results = list(pool.map(build, jobs))
    libraries = {name: entry for name, entry, _ in results if entry is not None}
    failed = {name: error for name, entry, error in results if entry is None}
    missing.update({name: error.splitlines()[0] for name, error in failed.items()})
    if failed and _required():  # (a library that FASTNF4_CUDA_ARCHS leaves out on purpose is no failure)
        raise RuntimeError("fastnf4: CUDA libraries not built (FASTNF4_REQUIRE_CUDA_BUILD=1): "
                           + "; ".join(f"lib{n}: {e}" for n, e in failed.items()))
    for name, error in failed.items():
        _loud(f"fastnf4: lib{name}.so was NOT built and is not in this wheel: {error}")
    for name, reason in missing.items():
        if name not in failed:
            _say(f"fastnf4: lib{name}.so is not in this wheel: {reason}")
    if not libraries:
        shutil.rmtree(out_dir)
        return []
    manifest = {
        "format": rules.MANIFEST_FORMAT,
        "nvcc_version": version,
        "cuda_version": release,
        "min_driver_cuda": release,  # the libraries link the CUDA runtime of this release
        "flags": list(rules.FLAGS),
        "archs": [f"sm_{a}" for a in archs],
        "libraries": libraries,
        "missing": missing,
    }
    path = os.path.join(out_dir, rules.MANIFEST)
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    return [os.path.join(out_dir, entry["file"]) for entry in libraries.values()] + [path]


class FastNF4Distribution(Distribution):
    cuda_libraries = False  # set once build_py has put CUDA libraries into the build: the wheel is then not pure

    def has_ext_modules(self):
        return bool(self.cuda_libraries) or super().has_ext_modules()


class BuildPy(build_py):
    """The Python files and package data, then the CUDA libraries into ``<build_lib>/fastnf4/_lib``."""

    def initialize_options(self):
        super().initialize_options()
        self.cuda_outputs: list[str] = []

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            _say("fastnf4: editable install: no prebuilt CUDA libraries; nvcc builds them on first use")
            return
        self.cuda_outputs = build_cuda_libraries(os.path.join(self.build_lib, "fastnf4", "_lib"))
        self.distribution.cuda_libraries = bool(self.cuda_outputs)

    def get_outputs(self, include_bytecode=True):
        return list(super().get_outputs(include_bytecode)) + list(self.cuda_outputs)


class BdistWheel(bdist_wheel):
    """Builds first, so that the wheel is tagged ``py3-none-<platform>`` when it carries CUDA libraries (they do not
    depend on the Python version) and ``py3-none-any`` when it does not."""

    def run(self):
        if not self.skip_build:
            self.run_command("build")
        self.root_is_pure = not (self.distribution.has_ext_modules() or self.distribution.has_c_libraries())
        super().run()

    def get_tag(self):
        impl, abi, plat = super().get_tag()
        return (impl, abi, plat) if self.root_is_pure else ("py3", "none", plat)


setup(distclass=FastNF4Distribution, cmdclass={"build_py": BuildPy, "bdist_wheel": BdistWheel})
