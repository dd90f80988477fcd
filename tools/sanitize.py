"""Every kernel of the package under NVIDIA compute-sanitizer, on small odd shapes: the Triton quantize / dequantize /
GEMV / GEMM, and every build and plan form of gemv_mma.cu (decode kernels of 16 / 20 warps with global, block-local,
cluster and split-major split-K, staged x or x in registers, the pair-column, burst, small-weight and GEMM kernels)
and wgmma.cu (every x-rows-per-block variant, 128 / 192 weight rows, forced split-K, whole tiles first, the cluster
sum), then fastnf4.linear's own pick at M 1..600. Each output is NaN-poisoned first where the API takes it and compared
with a float32 product on the dequantized weight (a loose bound: this looks for unwritten or garbage rows; the
numerics have their own tests), so a run also shows whether results hold under the tool's different scheduling.

usage: [FASTNF4_SANITIZE_QUICK=1] compute-sanitizer --tool TOOL --error-exitcode 1 python tools/sanitize.py [PART ...]
(PART: triton, gemv_mma, wgmma, linear (the default: all four), race: one launch per CUDA build, for racecheck)
(run with PYTORCH_NO_CUDA_MEMORY_CACHING=1, so that every tensor is its own allocation and an access past its end
is an error, not a read of the neighbouring tensor; QUICK: fewer shapes, for the slow tools)
The last line counts the launches, the plans a kernel refused (ValueError: a plan it cannot run), and the wrong
results; the exit status is 1 if any result was wrong."""
import os
import sys

import torch

import fastnf4
from fastnf4.api import linear_args
from fastnf4.ops.matmul import dispatch, gemv_mma, wgmma

QUICK = os.environ.get("FASTNF4_SANITIZE_QUICK") == "1"
counts = {"launches": 0, "refused": 0, "wrong": 0}


def weight(n, k, blocksize, nested, dtype=torch.bfloat16, quant_type="nf4"):
    w = torch.randn(n, k, device="cuda", dtype=dtype) * 0.05
    return fastnf4.quantize(w, blocksize=blocksize, double_quant=nested, quant_type=quant_type)


_last = [None, None, None, None]  # (x, q, bias, their reference): the loops vary the kernel and plan innermost


def reference(x, q, bias):
    """x @ dequant(q).T (+ bias) in float32, worked out once per (x, q, bias) in a row of calls (under the sanitizer
    every dequantize and matmul is instrumented too)."""
    if not (_last[0] is x and _last[1] is q and _last[2] is bias):
        ref = x.float() @ fastnf4.dequantize(q, torch.float32).T
        _last[:] = [x, q, bias, ref + bias.float() if bias is not None else ref]
    return _last[3]


def check(what, y, x, q, bias):
    """y against x @ dequant(q).T (+ bias) in float32: finite, relative Frobenius error <= 2e-2."""
    ref = reference(x, q, bias)
    err = ((y.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    counts["launches"] += 1
    if not (torch.isfinite(y).all() and err <= 2e-2):
        counts["wrong"] += 1
        print(f"WRONG {what}: error {err:.3g}, finite {bool(torch.isfinite(y).all())}", flush=True)


def run(what, fn, x, q, bias, m, n):
    """fn(y) into a NaN-poisoned y (or returning its own); a ValueError is a refused plan."""
    y = torch.full((m, n), float("nan"), device="cuda", dtype=x.dtype)
    try:
        out = fn(y)
    except ValueError:
        counts["refused"] += 1
        return
    check(what, y if out is None else out, x, q, bias)


def triton_kernels():
    shapes = [(17, 96, 32), (33, 320, 64), (300, 192, 4096), (129, 1088, 1024)] + ([] if QUICK else [(1000, 576, 128)])
    for n, k, bs in shapes:
        for nested in (False, True):
            for quant_type in ("nf4", "fp4"):
                for dtype in (torch.bfloat16, torch.float16, torch.float32):
                    w = torch.randn(n, k, device="cuda", dtype=dtype)
                    q = fastnf4.quantize(w, blocksize=bs, double_quant=nested, quant_type=quant_type)
                    out = torch.full((n, k), float("nan"), device="cuda", dtype=dtype)
                    fastnf4.dequantize(q, dtype, out=out)
                    counts["launches"] += 2
                    err = ((out.float() - w.float()).norm() / w.float().norm()).item()
                    if not (torch.isfinite(out).all() and err < 0.2):  # 4-bit rounding: ~0.1
                        counts["wrong"] += 1
                        print(f"WRONG quantize / dequantize {n}x{k} bs {bs} nested {nested} {quant_type} {dtype}: "
                              f"error {err:.3g}", flush=True)
            q = weight(n, k, bs, nested)
            for path, ms in (("gemv", (1, 2, 4)), ("gemm", (3, 17, 32)), ("dequant+matmul", (1, 64))):
                for m in ms:
                    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                    b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if m % 2 else None
                    run(f"triton {path} M {m} {n}x{k} bs {bs}",
                        lambda y: dispatch.linear_triton(x, *linear_args(q, b), path=path), x, q, b, m, n)


def gemv_plans(m, slices):
    """(kwargs, label) of the plan forms to force on the decode / GEMM kernels at M rows."""
    def parts(s):  # (S, slices per part) where S parts of that size cover K with none empty, else None
        per = -(-slices // s)
        return (s, per) if -(-slices // per) == s else None

    forms = [({}, "default"), ({"splits": (1, slices)}, "unsplit"), ({"splits": parts(3), "local": False}, "global 3")]
    if m <= 4:
        forms += [({"splits": parts(3), "local": True}, "local 3"),
                  ({"splits": parts(4), "local": True, "local_cluster": 2}, "cluster 2 S 4"),
                  ({"splits": parts(4), "local": True, "local_cluster": 2, "local_split": True},
                   "split-major cluster 2 S 4"),
                  ({"splits": parts(8), "local": False}, "global 8")]
    return [(kw, label) for kw, label in forms if kw.get("splits", 0) is not None]


def gemv_mma_kernels():
    # (17 x 256 / 128: an odd count of 8-bit codes, which the burst kernel, reading whole words, refuses)
    shapes = [(17, 192, 64, False), (5, 128, 64, True), (1000, 4096, 64, True), (300, 16384, 64, True),
              (17, 256, 128, True), (17, 256, 128, False)]
    if not QUICK:
        shapes += [(33, 320, 256, True), (129, 1088, 1024, False), (48, 96, 32, True), (2048, 5376, 128, False),
                   (1000, 4096, 4096, False)]
    for n, k, bs, nested in shapes:
        for dtype in (torch.bfloat16, torch.float16):
            if QUICK and dtype == torch.float16 and n != 1000:
                continue
            q = weight(n, k, bs, nested, dtype)
            slices = -(-k // 128)
            for m in (1, 2, 3, 4, 8, 16, 32):
                x = torch.randn(m, k, device="cuda", dtype=dtype)
                b = torch.randn(n, device="cuda", dtype=dtype) if m % 2 else None
                kernels = [gemv_mma.variant(m)]
                if m <= 2:
                    kernels += [gemv_mma.DECODE_WIDE, gemv_mma.SMALL, gemv_mma.SPLIT, gemv_mma.BURST]
                if m <= 4:
                    kernels += [gemv_mma.PAIR, gemv_mma.PAIR_WIDE]
                for kernel in kernels:
                    for kw, label in gemv_plans(m, slices):
                        if kernel in (gemv_mma.SMALL, gemv_mma.SPLIT, gemv_mma.BURST) and label != "default":
                            continue  # (they take whole rows: no split-K to force)
                        # the decode kernels with x staged in the table and with x in registers
                        for xs in ((True, False) if m <= 2 and kernel in (gemv_mma.DECODE, gemv_mma.DECODE_WIDE) else (True,)):
                            run(f"gemv_mma kernel {kernel} {label} xs {int(xs)} M {m} {n}x{k} bs {bs} nested {nested} "
                                f"{dtype}", lambda y: gemv_mma.launch(x, *linear_args(q, b), y=y, kernel=kernel,
                                                                      stage_x=xs, **kw),
                                x, q, b, m, n)
        if n == 1000 and bs == 64:  # statistics off 16-byte (and 4-byte) alignment: views into a larger buffer
            args = list(linear_args(q))
            for shift in (1, 4):
                step = args[1].element_size()
                if shift % step:
                    continue
                buf = torch.empty(args[1].numel() + shift // step, dtype=args[1].dtype, device="cuda")
                buf[shift // step:] = q.absmax
                shifted = args.copy()
                shifted[1] = buf[shift // step:]
                for m in (1, 2, 4, 16):
                    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                    run(f"gemv_mma statistics +{shift} bytes M {m}",
                        lambda y: gemv_mma.launch(x, *shifted, y=y), x, q, None, m, n)


def wgmma_kernels():
    # (wgmma.supports refuses statistics that do not end on a whole copy word: 17 x 192 / 64 = 51 floats, as the
    # odd N x K / blocksize of 300 x 2112 / 128 and 129 x 1088 / 1024 do; 36 x 192 / 64 = 108 runs)
    shapes = [(17, 192, 64, False), (36, 192, 64, False), (200, 1024, 64, True), (1000, 4096, 64, True)]
    if not QUICK:
        shapes += [(300, 2112, 128, True), (129, 1088, 1024, False), (20000, 128, 64, True)]
    for n, k, bs, nested in shapes:
        for dtype in (torch.bfloat16, torch.float16):
            if QUICK and dtype == torch.float16:
                continue
            q = weight(n, k, bs, nested, dtype)
            for m in (3, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 256, 300):
                x = torch.randn(m, k, device="cuda", dtype=dtype)
                if not wgmma.supports(x, q.packed_u8, bs, n, k, nested, q.nested_blocksize):
                    continue
                b = torch.randn(n, device="cuda", dtype=dtype) if m % 2 else None
                forms = [({}, "plan"), ({"splits": 2}, "split 2"), ({"splits": 3, "full_tiles": 1}, "split 3 after 1"),
                         ({"splits": 2, "cluster": True}, "cluster 2"), ({"splits": 5, "cluster": True}, "cluster 5")]
                if wgmma.block_m(m) == wgmma.WIDE_BM:
                    forms += [({"rows": wgmma.ROWS_WIDE}, "192 rows"), ({"rows": wgmma.ROWS_WIDE, "splits": 3},
                                                                        "192 rows split 3")]
                for kw, label in forms:
                    run(f"wgmma {label} M {m} {n}x{k} bs {bs} nested {nested} {dtype}",
                        lambda y: wgmma.launch(x, *linear_args(q, b), y=y, **kw), x, q, b, m, n)


def race_cases():
    """One launch of each CUDA kernel build and split-K form on one small weight (racecheck runs ~1000x slower than a
    plain launch): the decode kernels (default, block-local, cluster, split-major, global), split, burst, pair-column,
    GEMM and wgmma kernels (x tiles of 16 / 64 / 256 rows, the sum kernel, the cluster sum, 192 weight rows)."""
    n, k = 32, 1024
    q = weight(n, k, 64, True)
    slices = k // 128
    forms = [(1, {}), (1, {"kernel": gemv_mma.DECODE_WIDE}), (1, {"kernel": gemv_mma.SPLIT}),
             (1, {"kernel": gemv_mma.BURST}), (1, {"kernel": gemv_mma.DECODE, "splits": (2, slices // 2), "local": True}),
             (1, {"kernel": gemv_mma.DECODE, "splits": (2, slices // 2), "local": False}),
             (1, {"kernel": gemv_mma.DECODE, "splits": (4, slices // 4), "local": True, "local_cluster": 2}),
             (1, {"kernel": gemv_mma.DECODE, "splits": (4, slices // 4), "local": True, "local_cluster": 2, "local_split": True}),
             (4, {"kernel": gemv_mma.PAIR}), (4, {"kernel": gemv_mma.PAIR, "splits": (2, slices // 2), "local": True}),
             (8, {"kernel": gemv_mma.variant(8), "splits": (2, slices // 2)})]
    for m, kw in forms:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        run(f"gemv_mma M {m} {kw}", lambda y: gemv_mma.launch(x, *linear_args(q), y=y, **kw), x, q, None, m, n)
    for m, kw in ((9, {}), (64, {"splits": 2}), (64, {"splits": 2, "cluster": True}), (129, {}),
                  (100, {"rows": wgmma.ROWS_WIDE}), (300, {"splits": 2})):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        run(f"wgmma M {m} {kw}", lambda y: wgmma.launch(x, *linear_args(q), y=y, **kw), x, q, None, m, n)


def linear_picks():
    for n, k, bs, nested in [(17, 192, 64, False), (1000, 4096, 64, True), (4096, 2048, 64, True)]:
        q = weight(n, k, bs, nested)
        for m in (1, 2, 3, 4, 5, 8, 16, 24, 32, 64, 128, 200, 256, 300, 384, 512, 600):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if m % 2 else None
            run(f"linear M {m} {n}x{k}", lambda y: fastnf4.linear(x, q, b), x, q, b, m, n)


def main():
    torch.manual_seed(0)
    parts = sys.argv[1:] or ["triton", "gemv_mma", "wgmma", "linear"]
    for part in parts:
        before = dict(counts)
        {"triton": triton_kernels, "gemv_mma": gemv_mma_kernels, "wgmma": wgmma_kernels, "linear": linear_picks,
         "race": race_cases}[part]()
        torch.cuda.synchronize()
        print(f"{part}: {counts['launches'] - before['launches']} launches checked, "
              f"{counts['refused'] - before['refused']} plans refused, {counts['wrong'] - before['wrong']} wrong",
              flush=True)
    print(f"sanitize: {counts['launches']} launches checked, {counts['refused']} plans refused, "
          f"{counts['wrong']} wrong", flush=True)
    sys.exit(1 if counts["wrong"] else 0)


if __name__ == "__main__":
    main()
