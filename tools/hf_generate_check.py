"""A bnb-4bit checkpoint through transformers' own ``from_pretrained`` and ``generate()``: compiled greedy decoding gives
the eager tokens, and its decode speed against ``fastnf4 bench e2e``'s compiled mode for the same layers (issue 59).

usage: python tools/hf_generate_check.py OUT_DIR [--tiny] [--new-tokens 64] [--prompt 32] [--seed 0]

1. The model: Qwen3-32B's configuration cut to 4 layers (``study.e2e.build_config("qwen3-32b", 4)``), random weights,
   every linear but lm_head quantized by fastnf4 as it is built (``study.e2e.build_model``), written to a temporary
   folder with ``integrations.transformers.save_quantized`` (a bnb-4bit checkpoint, no bitsandbytes involved), freed.
2. Loaded as the README says: ``import fastnf4.integrations.hf_quantizer`` registers fastnf4's quantizer, then
   ``AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map="cuda")``. Where bitsandbytes is
   importable, ``hf_quantizer.register(bitsandbytes=True)`` first, so that the checkpoint still loads into fastnf4's
   ``Linear4bit`` (else transformers would load bitsandbytes' layers), and FASTNF4_PATCH_BITSANDBYTES=0 (unless set):
   no fastnf4 code runs behind bitsandbytes in this process. The JSON records the loaded layers' class.
3. Greedy ``generate()`` of ``--new-tokens`` tokens (``min_new_tokens`` the same: no early stop) from a random prompt
   (batch 1), ``cache_implementation="static"``: eager (``disable_compile=True``) and compiled (transformers' automatic
   compile of the decode step, as users get it: ``torch.compile(model.__call__)`` with its default ``CompileConfig``,
   inductor, mode "reduce-overhead"; the prefill stays eager; same in transformers 5.17 and 5.24). The token ids must
   be equal; where they are not, the first differing step is reported with the top-2 logit gaps of both runs there
   and the largest logit difference up to it (a near tie flipped by rounding, or not), and the compiled run is
   repeated once with ``torch._inductor.config.emulate_precision_casts = True`` (inductor then rounds fused bf16
   intermediates as eager does) for comparison; the verdict stays the first compiled run's.
4. Decode tokens/s of each generate, by ``bench.e2e.generate_speed``: after one more call, ``time.perf_counter()``
   around 3 calls (a ``torch.cuda.synchronize()`` before and after each), median; prefill = the median of 3
   ``generate(max_new_tokens=1)`` calls (one forward of the prompt plus generate's own set-up, which the long call
   pays too, run last: a static cache of another length would recompile the decode step); decode tok/s =
   (new tokens - 1) / (median total - median prefill).
5. A control: the same 4 layers in bf16 (random weights, no fastnf4 layer), eager against compiled tokens as in 3:
   whether compiling the step changes the tokens of a random-weight model without fastnf4 too.
6. In the same process, ``bench.e2e.run`` in mode "compiled" with ``e2e_generate`` (``--e2e-generate``), variant
   fastnf4, the same 4 layers, batch 1, the same prompt length and number of new tokens (its own random model, same
   shapes): its ``generate_tok_per_s`` is the same recipe on the in-memory model, and the check is the ratio of the
   loaded checkpoint's decode tok/s to it; the ratio to the row's graph-replay ``tok_per_s`` (the compiled step alone,
   without generate's per-token host work) is reported beside it.

Writes OUT_DIR/<gpu>-hf-generate.json (``h200-hf-generate.json`` on an H200) and prints a short table. Exit status: 1
if the compiled tokens differ from the eager ones, 3 if they are equal but the decode speed is not within 10% of
bench e2e's compiled generate figure, 0 if both hold. About 1-2 minutes on an H200 (75 s measured: five compiles
of 4 layers, about 4 GB of checkpoint written to and read from the temporary folder).

``--tiny``: a 2-layer tiny Qwen3 on the CPU (or the GPU where one is visible and ``--device cuda`` is given), the same
steps 1-3 without timing and without the bench. On the CPU transformers compiles nothing by itself (its automatic
compile is for accelerators), so there the compiled run asks for it with
``CompileConfig(backend="eager", mode="default")`` plus ``_compile_all_devices``: Dynamo traces the decode step
(transformers' compile path and fastnf4's op under Dynamo are exercised) but no inductor code is generated.
Output: OUT_DIR/cpu-hf-generate-tiny.json. tests/test_hf_generate_check.py runs it.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _bnb_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("bitsandbytes") is not None


def tiny_config():
    import transformers

    return transformers.Qwen3Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16)


def write_checkpoint(cfg, device: str, path: str) -> int:
    """Random weights for ``cfg``, quantized by fastnf4 as built, saved as a bnb-4bit checkpoint in ``path``; the
    model is freed. Returns the bytes written."""
    import torch

    from fastnf4.integrations.transformers import save_quantized
    from fastnf4.study.e2e import build_model, fastnf4_linear

    torch.manual_seed(0)
    model = build_model(cfg, fastnf4_linear, device, desc="checkpoint")
    save_quantized(model, path)
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def load(path: str, device: str):
    """The README's call, with fastnf4's quantizer registered (see the module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM

    import fastnf4.integrations.hf_quantizer as hfq

    register = "import fastnf4.integrations.hf_quantizer"
    if hfq.bitsandbytes_importable():
        hfq.register(bitsandbytes=True)
        register = "fastnf4.integrations.hf_quantizer.register(bitsandbytes=True)"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map=device).eval()
    kinds = sorted({f"{type(m).__module__}.{type(m).__name__}" for m in model.modules()
                    if type(m).__name__ == "Linear4bit"})
    info = {"register": register,
            "call": f"AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map={device!r})",
            "quantizer": type(getattr(model, "hf_quantizer", None)).__name__,
            "four_bit_layers": sum(type(m).__name__ == "Linear4bit" for m in model.modules()),
            "layer_classes": kinds}
    return model, info


def generate_kwargs(new_tokens: int, compiled: bool, compile_config=None) -> dict:
    from fastnf4.bench.e2e import generate_kwargs as kw

    return kw(new_tokens, compiled, compile_config)


def _generate(model, ids, kw: dict, logits: bool = False):
    import torch

    with torch.inference_mode():
        out = model.generate(ids, **kw, return_dict_in_generate=logits, output_logits=logits)
    return out


def first_difference(a: list[int], b: list[int], eager_logits, compiled_logits) -> dict | None:
    """None where the token lists are equal, else the first differing step (of the generated tokens) with the
    top-2 logit gap of each run there and the largest |eager - compiled| logit difference up to that step."""
    if a == b:
        return None
    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    def gap(logits):
        if logits is None or i >= len(logits):
            return None
        top = logits[i][0].float().topk(2).values
        return float(top[0] - top[1])

    diffs = [float((e.float() - c.float()).abs().max()) for e, c in zip(eager_logits[:i + 1], compiled_logits[:i + 1])]
    return {"step": i, "eager_token": a[i] if i < len(a) else None, "compiled_token": b[i] if i < len(b) else None,
            "eager_top2_gap": gap(eager_logits), "compiled_top2_gap": gap(compiled_logits),
            "max_logit_diff_up_to_step": max(diffs) if diffs else None, "equal_tokens": sum(x == y for x, y in zip(a, b))}


def run_tokens(model, ids, new_tokens: int, compile_config) -> dict:
    """Eager and compiled greedy generate: the generated ids of each, their per-step logits, whether equal."""
    prompt = ids.shape[1]
    eager = _generate(model, ids, generate_kwargs(new_tokens, False), logits=True)
    t0 = time.perf_counter()
    compiled = _generate(model, ids, generate_kwargs(new_tokens, True, compile_config), logits=True)
    _sync(ids.device)
    first_call_s = time.perf_counter() - t0
    a, b = eager.sequences[0, prompt:].tolist(), compiled.sequences[0, prompt:].tolist()
    import torch

    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # (0: the compiled run compiled nothing)
    return {"eager": a, "compiled": b, "equal": a == b, "first_compiled_call_s": first_call_s, "dynamo_graphs": graphs,
            "compiled_call": hasattr(model, "_compiled_call"),
            "first_difference": first_difference(a, b, eager.logits, compiled.logits)}


def _sync(device) -> None:
    import torch

    if getattr(device, "type", device) == "cuda":
        torch.cuda.synchronize()


def timings(model, ids, new_tokens: int, compile_config) -> dict:
    """Decode tokens/s of the compiled and the eager generate, by ``bench.e2e.generate_speed`` (module docstring,
    step 4; the compile happened in ``run_tokens``)."""
    from fastnf4.bench.e2e import generate_speed

    return {name: generate_speed(model, ids, new_tokens, compiled, compile_config)
            for name, compiled in (("compiled", True), ("eager", False))}


def bench_e2e(prompt: int, layers: int, new_tokens: int) -> dict:
    """``fastnf4 bench e2e --e2e-modes compiled --e2e-generate``, fastnf4, the same layers, batch 1, ``new_tokens``
    steps (its row and the copy bandwidth)."""
    from fastnf4.bench import e2e

    opts = argparse.Namespace(models=["qwen3-32b"], e2e_layers=layers, batches=[1], e2e_modes=["compiled"],
                              e2e_variants=["fastnf4"], e2e_generate=True, prompt=prompt, steps=new_tokens)
    res = e2e.run(opts)
    row = next(r for r in res["rows"] if r.get("mode") == "compiled")
    return {"row": row, "copy_GBps": res["copy"]["GBps"], "table": res["table"]}


def _reset_compiled(model) -> None:
    import torch

    from fastnf4.bench.e2e import reset_generate_compile

    reset_generate_compile(model)
    torch._dynamo.utils.counters.clear()


def bf16_control(cfg, ids, new_tokens: int, compile_config) -> dict:
    """The same architecture in bf16 (random weights, no fastnf4 layer), eager against compiled greedy tokens: whether
    the compiled decode step alone (inductor's fused bf16 arithmetic) changes tokens of a random-weight model."""
    import torch

    from fastnf4.study.e2e import build_model

    torch.manual_seed(0)
    model = build_model(cfg, None, ids.device.type, desc="bf16 control")
    _reset_compiled(model)
    try:
        tok = run_tokens(model, ids, new_tokens, compile_config)
    finally:
        _reset_compiled(model)
        del model
        gc.collect()
        torch.cuda.empty_cache()
    return {"tokens_equal": tok["equal"], "first_difference": tok["first_difference"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer tiny Qwen3, no timing, no bench (CPU test)")
    ap.add_argument("--device", default=None, help="cuda (default where a GPU is visible) or cpu (--tiny only)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--layers", type=int, default=4, help="Qwen3-32B layers kept (not with --tiny)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu" and not args.tiny:
        print("the full check needs a CUDA GPU (use --tiny on the CPU)", file=sys.stderr)
        return 2
    if _bnb_importable():  # before anything imports bitsandbytes (see the module docstring)
        os.environ.setdefault("FASTNF4_PATCH_BITSANDBYTES", "0")
    import transformers

    from fastnf4.bench.harness import environment
    from fastnf4.study.e2e import build_config

    cfg = tiny_config() if args.tiny else build_config("qwen3-32b", args.layers)
    compile_config = None  # transformers' default: what users get
    if device == "cpu":
        compile_config = transformers.CompileConfig(backend="eager", mode="default")
        compile_config._compile_all_devices = True
    env = environment()
    env["transformers"] = transformers.__version__
    env["FASTNF4_PATCH_BITSANDBYTES"] = os.environ.get("FASTNF4_PATCH_BITSANDBYTES")
    result = {"check": "hf-generate", "issue": 59,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "env": env,
              "device": device, "tiny": args.tiny, "model": "tiny-qwen3" if args.tiny else "qwen3-32b",
              "layers": cfg.num_hidden_layers, "batch": 1, "prompt": args.prompt, "new_tokens": args.new_tokens,
              "seed": args.seed,
              "generate": {"eager": generate_kwargs(args.new_tokens, False),
                           "compiled": {**generate_kwargs(args.new_tokens, True),
                                        "compile_config": compile_config.to_dict() if compile_config else
                                        "transformers' default (inductor, mode reduce-overhead)"}}}
    tmp = tempfile.mkdtemp(prefix="fastnf4-hf-generate-")
    try:
        t0 = time.perf_counter()
        result["checkpoint_bytes"] = write_checkpoint(cfg, device, tmp)
        result["checkpoint_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        model, result["loader"] = load(tmp, device)
        result["load_s"] = time.perf_counter() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ids = torch.randint(0, cfg.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(args.seed))
    ids = ids.to(device)
    _reset_compiled(model)
    tokens = run_tokens(model, ids, args.new_tokens, compile_config)
    result["tokens_equal"] = tokens["equal"]
    result["first_difference"] = tokens["first_difference"]
    result["eager_tokens"], result["compiled_tokens"] = tokens["eager"], tokens["compiled"]
    result["first_compiled_call_s"] = tokens["first_compiled_call_s"]
    result["compiled_call"], result["dynamo_graphs"] = tokens["compiled_call"], tokens["dynamo_graphs"]
    if device == "cuda" and not args.tiny:
        result["timing"] = timings(model, ids, args.new_tokens, compile_config)
        if not tokens["equal"]:  # for the report only: the same with eager's rounding of fused bf16 intermediates
            import torch._inductor.config as inductor_config

            _reset_compiled(model)
            inductor_config.emulate_precision_casts = True
            try:
                again = run_tokens(model, ids, args.new_tokens, compile_config)
            finally:
                inductor_config.emulate_precision_casts = False
            result["retry_emulate_precision_casts"] = {"tokens_equal": again["equal"],
                                                       "first_difference": again["first_difference"]}
        _reset_compiled(model)
        del model
        gc.collect()
        torch.cuda.empty_cache()
        result["bf16_control"] = bf16_control(cfg, ids, args.new_tokens, compile_config)
        e2e = bench_e2e(args.prompt, args.layers, args.new_tokens)
        result["e2e"] = {"row": e2e["row"], "copy_GBps": e2e["copy_GBps"]}
        hf = result["timing"]["compiled"]["decode_tok_per_s"]
        bench = e2e["row"].get("generate_tok_per_s")
        step = e2e["row"].get("tok_per_s")
        result["ratio_generate_over_e2e"] = hf / bench if hf and bench else None
        result["ratio_generate_over_e2e_graph_replay"] = hf / step if hf and step else None
        result["within_10pct"] = bool(result["ratio_generate_over_e2e"]
                                      and abs(result["ratio_generate_over_e2e"] - 1) <= 0.10)
    gpu = "cpu" if device == "cpu" else env["gpu"].lower().replace("nvidia ", "").replace(" ", "-")
    name = f"{gpu}-hf-generate{'-tiny' if args.tiny else ''}.json"
    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, name)
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(report(result))
    print(f"\nwrote {path}")
    if not result["tokens_equal"]:
        return 1
    if "within_10pct" in result and not result["within_10pct"]:
        return 3
    return 0


def report(r: dict) -> str:
    lines = [f"{r['model']} ({r['layers']} layers), {r['device']}, {r['loader']['four_bit_layers']} x "
             f"{'/'.join(r['loader']['layer_classes'])} via {r['loader']['quantizer']}; transformers "
             f"{r['env']['transformers']}, torch {r['env']['torch']}",
             f"greedy generate of {r['new_tokens']} tokens, prompt {r['prompt']}: compiled == eager: {r['tokens_equal']} "
             f"(transformers' compiled call used: {r['compiled_call']}, Dynamo graphs: {r['dynamo_graphs']})"]
    if r["first_difference"]:
        lines.append(f"  first difference: {r['first_difference']}")
    if "retry_emulate_precision_casts" in r:
        lines.append(f"  with emulate_precision_casts: {r['retry_emulate_precision_casts']}")
    if "timing" in r:
        t = r["timing"]

        def f(x, fmt):
            return "-" if x is None else format(x, fmt)

        def ms(xs):
            return f(statistics.median(xs) * 1e3, ".1f")

        lines += ["", f"{'':30}{'total ms':>10}{'decode tok/s':>14}",
                  f"{'generate eager':30}{ms(t['eager']['total_s']):>10}{f(t['eager']['decode_tok_per_s'], '.1f'):>14}",
                  f"{'generate compiled':30}{ms(t['compiled']['total_s']):>10}"
                  f"{f(t['compiled']['decode_tok_per_s'], '.1f'):>14}",
                  f"{'prefill (max_new_tokens=1)':30}{ms(t['compiled']['prefill_s']):>10}",
                  f"{'bench e2e compiled: generate':30}{'':10}"
                  f"{f(r['e2e']['row'].get('generate_tok_per_s'), '.1f'):>14}",
                  f"{'bench e2e compiled: graph step':30}{'':10}{f(r['e2e']['row'].get('tok_per_s'), '.1f'):>14}",
                  f"ratio generate / bench e2e generate: {f(r['ratio_generate_over_e2e'], '.3f')}, within 10%: "
                  f"{r['within_10pct']}; / bench e2e graph step: {f(r['ratio_generate_over_e2e_graph_replay'], '.3f')}"]
        if "bf16_control" in r:
            lines.append(f"bf16 control (no fastnf4 layer), compiled == eager: {r['bf16_control']['tokens_equal']} "
                         f"{r['bf16_control']['first_difference'] or ''}")
        if r["e2e"]["row"].get("note"):
            lines.append(f"bench e2e note: {r['e2e']['row']['note']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
