"""Whether two builds of fastnf4's CUDA libraries hold the same machine code: SASS per (architecture, function),
resource usage per function and the PTX per virtual architecture, compared with only the instruction addresses
(``/*0a30*/``) and the fatbin headers left out (instruction text and both encoding words must match).

    python tools/sass_diff.py build SRC_DIR OUT_DIR [--libs gemv_mma,wgmma] [--archs "80;86;89;90"]
    python tools/sass_diff.py diff OLD NEW [--report FILE]

``build`` compiles SRC_DIR/<lib>.cu into OUT_DIR/lib<lib>.so with the nvcc command of the wheel build (setup.py):
``fastnf4/_cuda.py``'s FLAGS and the SASS / PTX targets of ``package_targets`` for the architectures (default: the
wheel's, ``DEFAULT_ARCHS``), so a source tree is checked exactly as it ships. The sources of a commit, for instance:
``mkdir /tmp/old && git show HEAD:fastnf4/ops/matmul/gemv_mma.cu > /tmp/old/gemv_mma.cu`` (and any header it
includes). ``diff`` takes two libraries or two folders of lib*.so (paired by file name), prints per library and
architecture how many functions there are and how many are identical, names the ones that differ or exist on one side
only (with instruction counts), and exits 1 on any difference (of SASS, resource usage or PTX); it also says how many
of the embedded ELF images are byte-identical. nvcc: ``$FASTNF4_NVCC``, else ``nvcc`` on PATH;
cuobjdump: ``$CUOBJDUMP``, else on PATH, else next to nvcc, else the one bundled with Triton.
"""
from __future__ import annotations

import argparse
import difflib
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")  # an instruction's address comment
_ENCODING = re.compile(r"^\s*/\* 0x[0-9a-f]{16} \*/\s*$")  # the second encoding word, on a line of its own


def _rules():
    """fastnf4/_cuda.py as a standalone module (standard library only at import, as setup.py loads it)."""
    spec = importlib.util.spec_from_file_location("_fastnf4_cuda_rules", os.path.join(ROOT, "fastnf4", "_cuda.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def cuobjdump() -> str:
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not found:
        nvcc = shutil.which(os.environ.get("FASTNF4_NVCC") or "nvcc")
        beside = os.path.join(os.path.dirname(os.path.realpath(nvcc)), "cuobjdump") if nvcc else ""
        if beside and os.access(beside, os.X_OK):
            found = beside
    if not found:
        try:
            import triton
            found = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        except ImportError:
            pass
    if not found or not os.access(found, os.X_OK):
        sys.exit("sass_diff: no cuobjdump (set CUOBJDUMP)")
    return found


def build(src: str, out: str, libs: list[str], archs_text: str | None) -> None:
    rules = _rules()
    archs = rules.parse_archs(archs_text)
    nvcc = os.environ.get("FASTNF4_NVCC") or "nvcc"
    os.makedirs(out, exist_ok=True)
    for name in libs:
        lib = rules.LIBRARIES[name]
        sass, ptx = rules.package_targets(lib, archs)
        if not sass:
            print(f"{name}: no architecture of {archs} applies; skipped")
            continue
        cmd = [nvcc, *rules.fat_gencode(sass, ptx), *rules.FLAGS, "--threads", "0", "-o",
               os.path.join(out, f"lib{name}.so"), os.path.join(src, os.path.basename(lib.source))]
        start = time.monotonic()
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(f"{name}: nvcc failed:\n{' '.join(cmd)}\n{(res.stderr or res.stdout)[-4000:]}")
        print(f"{name}: {time.monotonic() - start:.0f} s: {' '.join(cmd)}")


def _sections(text: str):
    """(arch, line) for each line of cuobjdump output, arch from the fatbin entry's header."""
    arch = None
    for line in text.splitlines():
        m = re.match(r"\s*arch = (\S+)", line)
        if m:
            arch = m.group(1)
        yield arch, line


def sass(lib: str) -> dict[tuple[str, str], list[str]]:
    """{(arch, mangled function name): normalized instruction lines}."""
    text = subprocess.run([cuobjdump(), "-sass", lib], capture_output=True, text=True, check=True).stdout
    out: dict[tuple[str, str], list[str]] = {}
    key = None
    for arch, line in _sections(text):
        if "Function :" in line:
            key = (arch, line.split("Function :", 1)[1].strip())
            if key in out:
                sys.exit(f"sass_diff: {lib}: {key} twice")
            out[key] = []
        elif re.match(r"\s*(Fatbin|arch =|code version|host =|compile_size|identifier =|=+$)", line):
            key = None  # a new fatbin entry
        elif key is not None and (_ADDRESS.search(line) or _ENCODING.match(line)):
            out[key].append(re.sub(r"\s+", " ", _ADDRESS.sub("", line)).strip())
        elif key is not None and line.strip() and not line.strip().startswith(("..", ".headerflags")):
            out[key].append(line.strip())  # labels (.L_x_12:) and anything else cuobjdump prints in a function
    return out


def resources(lib: str) -> dict[tuple[str, str], str]:
    """{(arch, function): its resource-usage line (registers, stack, shared, local, constant banks ...)}."""
    text = subprocess.run([cuobjdump(), "-res-usage", lib], capture_output=True, text=True, check=True).stdout
    out, name = {}, None
    for arch, line in _sections(text):
        m = re.match(r"\s*Function (\S+):\s*$", line)
        if m:
            name = m.group(1)
        elif name and line.strip():
            out[(arch, name)] = re.sub(r"\s+", " ", line.strip())
            name = None
    return out


def ptx(lib: str) -> dict[str, list[str]]:
    """{virtual arch: PTX lines}, without comments (compiler banner) and blank lines."""
    text = subprocess.run([cuobjdump(), "-ptx", lib], capture_output=True, text=True, check=True).stdout
    out: dict[str, list[str]] = {}
    for arch, line in _sections(text):
        s = line.strip()
        if (arch is None or not s or s.startswith("//") or s.startswith("=")
                or re.match(r"(Fatbin|arch =|code version|host =|compile_size|identifier =)", s)):
            continue
        out.setdefault(arch.replace("sm_", "compute_"), []).append(s)
    return out


def elf_images(lib: str, folder: str) -> dict[str, bytes]:
    """{file name cuobjdump gives it (libX.N.sm_XY.cubin): bytes} of every ELF image in ``lib``."""
    subprocess.run([cuobjdump(), "-xelf", "all", os.path.abspath(lib)], cwd=folder, capture_output=True, check=True)
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = f.read()
    return out


def _demangle(name: str) -> str:
    try:
        return subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip() or name
    except OSError:
        return name


def compare(old: str, new: str, say) -> bool:
    """Print the comparison of two libraries; True where everything is identical."""
    same = True
    s_old, s_new = sass(old), sass(new)
    r_old, r_new = resources(old), resources(new)
    for arch in sorted({a for a, _ in s_old} | {a for a, _ in s_new}):
        fo = {f for a, f in s_old if a == arch}
        fn = {f for a, f in s_new if a == arch}
        both = sorted(fo & fn)
        equal = [f for f in both if s_old[(arch, f)] == s_new[(arch, f)]
                 and r_old.get((arch, f)) == r_new.get((arch, f))]
        instr = sum(len(s_new[(arch, f)]) for f in fn) // 2  # two lines (words) per instruction
        say(f"  SASS {arch}: {len(fo)} -> {len(fn)} functions, {len(equal)} identical "
            f"(SASS and resource usage), ~{instr} instructions")
        for f in sorted(fo - fn):
            same = False
            say(f"    only in old: {_demangle(f)[:160]}")
        for f in sorted(fn - fo):
            same = False
            say(f"    only in new: {_demangle(f)[:160]}")
        for f in both:
            if f in equal:
                continue
            same = False
            a, b = s_old[(arch, f)], s_new[(arch, f)]
            say(f"    differs: {_demangle(f)[:160]}: {len(a) // 2} -> {len(b) // 2} instructions; "
                f"resources {r_old.get((arch, f))!r} -> {r_new.get((arch, f))!r}")
            for line in list(difflib.unified_diff(a, b, "old", "new", n=1, lineterm=""))[:12]:
                say(f"      {line}")
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        e_old, e_new = elf_images(old, a), elf_images(new, b)
    equal = [n for n in e_new if e_old.get(n) == e_new[n]]
    say(f"  ELF images (informational: symbol order or metadata may differ where the SASS does not): "
        f"{len(e_old)} -> {len(e_new)}, {len(equal)} byte-identical")
    p_old, p_new = ptx(old), ptx(new)
    for arch in sorted(set(p_old) | set(p_new)):
        ok = p_old.get(arch) == p_new.get(arch)
        same &= ok
        say(f"  PTX {arch}: {len(p_old.get(arch, []))} -> {len(p_new.get(arch, []))} lines, "
            f"{'identical' if ok else 'DIFFERENT'}")
    return same


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the libraries of a source folder with the wheel's nvcc command")
    b.add_argument("src")
    b.add_argument("out")
    b.add_argument("--libs", default="gemv_mma,wgmma")
    b.add_argument("--archs", default=None, help="as FASTNF4_CUDA_ARCHS (default: the wheel's architectures)")
    d = sub.add_parser("diff", help="compare two libraries or two folders of lib*.so")
    d.add_argument("old")
    d.add_argument("new")
    d.add_argument("--report", help="also write the summary to this file")
    args = ap.parse_args()
    if args.cmd == "build":
        build(args.src, args.out, [x for x in args.libs.split(",") if x], args.archs)
        return 0
    if os.path.isdir(args.old) != os.path.isdir(args.new):
        sys.exit("sass_diff: give two libraries or two folders")
    if os.path.isdir(args.old):
        names = sorted({os.path.basename(p) for p in glob.glob(os.path.join(args.old, "lib*.so"))}
                       | {os.path.basename(p) for p in glob.glob(os.path.join(args.new, "lib*.so"))})
        pairs = [(os.path.join(args.old, n), os.path.join(args.new, n)) for n in names]
    else:
        pairs = [(args.old, args.new)]
    lines: list[str] = []

    def say(text: str) -> None:
        print(text)
        lines.append(text)

    same = True
    for old, new in pairs:
        say(f"{os.path.basename(new)}: {old} -> {new}")
        if not (os.path.exists(old) and os.path.exists(new)):
            say("  missing on one side")
            same = False
            continue
        same &= compare(old, new, say)
    say("IDENTICAL" if same else "DIFFERENT")
    if args.report:
        with open(args.report, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
