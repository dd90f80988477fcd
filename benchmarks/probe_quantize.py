"""The NF4 quantize kernel's forms on a few shapes: the code by the threshold count or bitsandbytes' tree
(`TREE`), the elements flushed by one mul.ftz (`MUL_FTZ`), elements per program and warps. Each form is first
checked bit for bit against the production form (and against bitsandbytes where it is installed) on weights with
NaN / Inf / subnormal / zero blocks, outputs poisoned; then timed as in bench dequant (graph replays over buffers
rotated past the L2, every form of a shape interleaved). The 4-bit kernel alone: no double quant.
The double quant's 8-bit kernel likewise (`nested_part`; `--nested-only` skips the 4-bit part).
usage: python benchmarks/probe_quantize.py [OUT.json] [--nested-only]"""
import itertools
import json
import sys

import torch

from fastnf4.bench.common import bnb_functional
from fastnf4.bench.harness import copy_bandwidth, environment, rotation_count, time_graphs
from fastnf4.ops.quantize import kernel

SHAPES = [("llama gate+up", 28672, 8192), ("qwen q", 8192, 5120), ("gemma o", 5376, 4096), ("qwen k+v", 1024, 5120)]
FORMS = [dict(tree=t, mul_ftz=f, elems_per_prog=e, num_warps=w)
         for (t, f), e, w in itertools.product(((False, False), (True, False), (False, True), (True, True)),
                                               (2048, 4096, 8192), (4, 8))]


def special_weight(n, k, dtype, gen):
    w = torch.randn(n, k, dtype=torch.float32, device="cuda", generator=gen)
    flat = w.view(-1)
    flat[7::1001] = float("nan")
    flat[64 * 5: 64 * 6] = 1e-39  # a block of float32 subnormals (bf16 keeps them; fp16 flushes them to 0)
    flat[64 * 9 + 3] = 1e-39  # one subnormal in a normal block
    flat[64 * 11: 64 * 12] = 0.0
    flat[64 * 13: 64 * 14] = float("nan")
    flat[64 * 17 + 5] = float("inf")
    return w.to(dtype)


def launch(w, packed, absmax, form):
    kernel.launch_4bit(w.view(-1), packed, absmax, 64, "nf4", **form)


NESTED_PRODUCTION = dict(select2=False, elems_per_prog=2048, num_warps=4)  # the form timed first: the baseline
NESTED_FORMS = [NESTED_PRODUCTION] + [f for f in (dict(select2=s, elems_per_prog=e, num_warps=w) for s, e, w in
                                                  itertools.product((False, True), (256, 512, 2048), (1, 2, 4)))
                                      if f != NESTED_PRODUCTION]


def nested_part(rows):
    """The double quant's second kernel (8-bit codes of absmax - offset, blocks of 256) on the absmax arrays of the
    model weights at blocksize 64, its forms against the production one; and the offset's mean alone."""
    from fastnf4.codebooks import dynamic_map

    code = dynamic_map(torch.device("cuda"))
    for name, n, k in SHAPES + [("llama gate_up", 57344, 8192)]:
        nb = n * k // 64
        gen = torch.Generator(device="cuda").manual_seed(nb)
        a = torch.rand(nb, device="cuda", generator=gen) * 3
        off = a.mean()
        ref_q = torch.empty(nb, dtype=torch.uint8, device="cuda")
        ref_s = torch.empty(-(-nb // 256), dtype=torch.float32, device="cuda")
        kernel.launch_8bit(a, off, code, ref_q, ref_s, 256)
        for form in NESTED_FORMS:
            q = torch.full_like(ref_q, 0xA5)
            s = torch.full_like(ref_s, float("nan"))
            kernel.launch_8bit(a, off, code, q, s, 256, **form)
            assert torch.equal(q, ref_q) and torch.equal(s.view(torch.int32), ref_s.view(torch.int32)), (name, form)
        reps = rotation_count(5 * nb)
        as_ = [torch.rand(nb, device="cuda", generator=gen) for _ in range(reps)]
        qs = [torch.empty_like(ref_q) for _ in range(reps)]
        ss = [torch.empty_like(ref_s) for _ in range(reps)]
        providers = {str(i): [lambda j=j, f=form: kernel.launch_8bit(as_[j], off, code, qs[j], ss[j], 256, **f)
                              for j in range(reps)] for i, form in enumerate(NESTED_FORMS)}
        providers["mean"] = [lambda j=j: as_[j].mean() for j in range(reps)]
        times = time_graphs(providers, per_graph=max(20, reps))
        base = times["0"]["median_us"]
        for i, form in enumerate(NESTED_FORMS):
            rows.append(dict(part="nested", shape=name, absmax=nb, **form, us=times[str(i)]["median_us"],
                             vs_production=base / times[str(i)]["median_us"]))
        best = min(rows[-len(NESTED_FORMS):], key=lambda r: r["us"])
        rows.append(dict(part="nested", shape=name, absmax=nb, mean_us=times["mean"]["median_us"]))
        print(f"nested {name:14s} {nb:8d} absmax: mean {times['mean']['median_us']:5.1f} us, 8-bit production "
              f"{base:5.1f} us, best {best['us']:5.1f} ({best['select2']:d}/{best['elems_per_prog']}/{best['num_warps']})")


def main(out_path=None):
    F = bnb_functional()
    copy = copy_bandwidth()["GBps"]
    print(f"copy {copy:.0f} GB/s; forms: tree / mul_ftz / elements per program / warps")
    rows = []
    nested_part(rows)
    if "--nested-only" in sys.argv:
        return _write(out_path, copy, rows)
    for (name, n, k), dtype in itertools.product(SHAPES, (torch.bfloat16, torch.float16)):
        gen = torch.Generator(device="cuda").manual_seed(n + k)
        w = special_weight(n, k, dtype, gen)
        nb = n * k // 64
        ref_p = torch.empty(n * k // 2, dtype=torch.uint8, device="cuda")
        ref_a = torch.empty(nb, dtype=torch.float32, device="cuda")
        launch(w, ref_p, ref_a, dict())
        if F is not None:
            bp, bs = F.quantize_4bit(w, blocksize=64, compress_statistics=False, quant_type="nf4")
            assert torch.equal(bp.view(-1), ref_p) and torch.equal(bs.absmax.view(torch.int32), ref_a.view(torch.int32)), name
        for form in FORMS:
            p = torch.full_like(ref_p, 0xA5)
            a = torch.full_like(ref_a, float("nan"))
            launch(w, p, a, form)
            assert torch.equal(p, ref_p) and torch.equal(a.view(torch.int32), ref_a.view(torch.int32)), (name, form)
        moved = w.numel() * w.element_size() + ref_p.numel() + 4 * nb
        reps = rotation_count(moved)
        ws = [torch.randn(n, k, dtype=dtype, device="cuda", generator=gen) for _ in range(reps)]
        ps = [torch.empty_like(ref_p) for _ in range(reps)]
        as_ = [torch.empty_like(ref_a) for _ in range(reps)]
        providers = {str(i): [lambda j=j, f=form: launch(ws[j], ps[j], as_[j], f) for j in range(reps)]
                     for i, form in enumerate(FORMS)}
        times = time_graphs(providers, per_graph=max(20, reps))
        base = times["0"]["median_us"]
        for i, form in enumerate(FORMS):
            us = times[str(i)]["median_us"]
            rows.append(dict(shape=name, N=n, K=k, dtype=str(dtype).removeprefix("torch."), **form, us=us,
                             pct_copy=100 * moved / us / 1e3 / copy, vs_production=base / us))
        best = max((r for r in rows[-len(FORMS):]), key=lambda r: r["pct_copy"])
        print(f"{name:14s} {str(dtype)[6:]:9s} production {base:7.1f} us {rows[-len(FORMS)]['pct_copy']:5.1f}% | best "
              f"{best['us']:7.1f} us {best['pct_copy']:5.1f}% ({best['tree']:d}/{best['mul_ftz']:d}/"
              f"{best['elems_per_prog']}/{best['num_warps']})")
        ws = ps = as_ = None
        torch.cuda.empty_cache()
    for tf in ((False, False), (True, False), (False, True), (True, True)):
        sel = [r for r in rows if (r["tree"], r["mul_ftz"]) == tf]
        print("tree/mul_ftz", tf, "best pct_copy by shape:",
              {f"{s} {d}": round(max(r["pct_copy"] for r in sel if (r["shape"], r["dtype"]) == (s, d)), 1)
               for s, d in dict.fromkeys((r["shape"], r["dtype"]) for r in sel)})
    _write(out_path, copy, rows)


def _write(out_path, copy, rows):
    if out_path:
        with open(out_path, "w") as f:
            json.dump({"env": environment(), "copy_GBps": copy, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(*[a for a in sys.argv[1:] if not a.startswith("--")])
