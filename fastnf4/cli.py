"""``fastnf4`` console script (also ``python -m fastnf4``)."""
from __future__ import annotations

import argparse
import datetime
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fastnf4", description="fastnf4: fast NF4 kernels, bitsandbytes-compatible")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    bench = sub.add_parser("bench", help="run a benchmark on the current CUDA GPU")
    bench.add_argument("name", choices=["dequant", "quantize", "matmul", "paper", "e2e"], help="which benchmark")
    bench.add_argument("--models", nargs="*", default=None,
                       help="restrict to these models (llama-3.3-70b, qwen3-32b, gemma-3-27b)")
    bench.add_argument("--layers", nargs="*", default=None,
                       help="matmul: restrict to these layers (q+o, k+v, gate+up, down, qkv, gate_up, q, o)")
    bench.add_argument("--shapes", nargs="+", default=None, metavar="NxK",
                       help="matmul: weight shapes (out x in features, e.g. 320x5120 4096x4000) instead of the models'")
    bench.add_argument("--blocksize", type=int, default=64)
    bench.add_argument("--m", type=int, nargs="*", default=None, help="matmul: rows of x (default 1..2048)")
    bench.add_argument("--layouts", nargs="+", default=None, choices=["bnb", "fastnf4"],
                       help="matmul: weight layouts timed for fastnf4.linear (default: bnb; fastnf4 adds the column "
                            "fastnf4_layout_us: the same weights repacked, fastnf4.repack)")
    bench.add_argument("--no-e2e", action="store_true", help="paper: kernels only, skip the generate() decomposition")
    bench.add_argument("--e2e-layers", type=int, default=0, help="paper / e2e: cut the model to this many layers (0: all)")
    bench.add_argument("--batches", type=int, nargs="*", default=None, help="e2e: batch sizes (default 1 8 32)")
    bench.add_argument("--prompt", type=int, default=160, help="e2e: prompt tokens (GSM8K-like length)")
    bench.add_argument("--steps", type=int, default=32, help="e2e: timed decode steps")
    bench.add_argument("--e2e-modes", nargs="+", default=None, choices=["eager", "graph", "compiled"],
                       help="e2e: decode modes (default: eager graph; compiled: torch.compile + a CUDA graph, one "
                            "compile per batch size and variant, about 2 minutes each at full depth on an H200)")
    bench.add_argument("--e2e-generate", action="store_true",
                       help="e2e: compiled rows also time transformers' generate() with its own compile of the decode "
                            "step (static cache, the documented recipe): one more compile per batch size and variant")
    bench.add_argument("--e2e-variants", nargs="+", default=None, choices=["fastnf4", "bnb", "bnb+fastnf4", "bf16"],
                       help="e2e: variants (default: all; the bitsandbytes ones where bitsandbytes imports)")
    bench.add_argument("--json", default=None, help="where to write the JSON (default: benchmarks/results/<gpu>-<name>.json)")
    doctor = sub.add_parser("doctor", help="versions, GPUs, which kernels run, the bitsandbytes patch and a self-check "
                                           "of each op (paste its output into bug reports); exit 1 if a check fails")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    opts = parser.parse_args(argv)
    if opts.version:
        import fastnf4

        print(fastnf4.__version__)
        return 0
    if opts.command == "doctor":
        from fastnf4 import doctor as _doctor

        return _doctor.main(as_json=opts.json)
    if opts.command != "bench":
        parser.print_help()
        return 0

    import torch

    if not torch.cuda.is_available():
        print("fastnf4 bench needs a CUDA GPU; none is visible here.", file=sys.stderr)
        return 2
    from fastnf4.bench.harness import environment, write_json
    from fastnf4.bench.registry import BENCHMARKS, load_all

    load_all()
    env = environment()
    if env.get("bitsandbytes"):
        # the benchmarks' bitsandbytes columns measure bitsandbytes' own kernels: fastnf4's patch (applied at
        # bitsandbytes' import where fastnf4 is installed, also under inference_mode) is removed first (``bench
        # paper`` patches it back for its "bnb+fastnf4" rows)
        from fastnf4.integrations.bitsandbytes import unpatch_bitsandbytes

        unpatch_bitsandbytes()
    result = BENCHMARKS[opts.name](opts)
    gpu = env["gpu"].lower().replace("nvidia ", "").replace(" ", "-")
    path = opts.json or os.path.join("benchmarks", "results", f"{gpu}-{opts.name}.json")
    payload = {"benchmark": opts.name, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "env": env, "copy": result.get("copy"), "rows": result["rows"],
               **{k: v for k, v in result.items() if k not in ("copy", "rows", "table")}}
    write_json(path, payload)
    print(result["table"])
    print(f"\nwrote {path}")
    return 0
