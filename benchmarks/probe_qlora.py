"""A QLoRA training step (forward with loss + backward; LoRA r = 16 on every linear of the decoder layers) on MODEL
cut to LAYERS, random weights, batch B x sequence T tokens, in ROUNDS alternating rounds of three set-ups:
- "bnb": PEFT on the bitsandbytes NF4 model, bitsandbytes' own kernels (fastnf4's patch off);
- "bnb+fastnf4": the same model and adapters with the patch on (forward 4-bit matmuls and backward dequantizes);
- "fastnf4": the same checkpoint as fastnf4 Linear4bit layers, LoRA through fastnf4.integrations.peft.
Loss values are checked against each other first (same quantized bytes and adapter seed: GEMM rounding apart).
Times are CUDA-event medians of STEPS steps after 2 warm-up steps; the optimizer step is left out (the same for all).
FASTNF4_PROBE_PROFILE=1 adds one profiled step per set-up (GPU time by kernel, torch.profiler).
usage: probe_qlora.py MODEL LAYERS ROUNDS B T STEPS [JSON]"""
import json
import os
import statistics
import sys

import torch

import fastnf4
from fastnf4.bench import e2e
from fastnf4.bench.harness import environment
from fastnf4.integrations import bitsandbytes as integ
from fastnf4.integrations import peft as fpeft

import peft  # noqa: E402

name, layers, rounds, batch, length, steps = sys.argv[1], *(int(a) for a in sys.argv[2:7])
out_json = sys.argv[7] if len(sys.argv) > 7 else None

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def with_lora(model, own: bool):
    torch.manual_seed(1)
    cfg = peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS)
    return fpeft.get_peft_model(model, cfg) if own else peft.get_peft_model(model, cfg)


def build(variant: str):
    torch.manual_seed(0)  # the same random bf16 weights for both, so the same NF4 bytes (bitsandbytes-exact)
    return with_lora(e2e._make(name, layers, variant), variant == "fastnf4")


fastnf4.unpatch_bitsandbytes()
models = {"bnb": build("bnb"), "fastnf4": build("fastnf4")}
vocab = models["bnb"].config.vocab_size
ids = torch.randint(0, vocab, (batch, length), device="cuda", generator=torch.Generator(device="cuda").manual_seed(3))


def step(model):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss


def timed(model) -> tuple[float, float]:
    for _ in range(2):
        loss = step(model)
    times = []
    for _ in range(steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        loss = step(model)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times), loss.item()


setups = (("bnb", False), ("bnb+fastnf4", True), ("fastnf4", False))
res = {"env": {**environment(), "peft": peft.__version__}, "model": name, "layers": layers, "batch": batch, "length": length, "lora_r": 16, "rounds": []}
for r in range(rounds):
    for label, patched in setups:
        (fastnf4.patch_bitsandbytes if patched else fastnf4.unpatch_bitsandbytes)()
        integ.CALLS.clear()
        t, loss = timed(models["fastnf4" if label == "fastnf4" else "bnb"])
        calls = sum(integ.CALLS.values())
        res["rounds"].append(dict(round=r, setup=label, step_us=t, loss=loss, fastnf4_patch_calls=calls))
        print(f"round {r} {label:12s} step {t / 1e3:8.2f} ms  loss {loss:.5f}  patched calls {calls}", flush=True)
    if r == 0:  # the set-ups compute the same step: losses within GEMM rounding, the patch really taken
        losses = [x["loss"] for x in res["rounds"]]
        assert max(abs(v - losses[0]) for v in losses) < 2e-2 * abs(losses[0]), losses
        assert res["rounds"][1]["fastnf4_patch_calls"] > 0 and res["rounds"][0]["fastnf4_patch_calls"] == 0
if os.environ.get("FASTNF4_PROBE_PROFILE") == "1":  # where each set-up's step time goes, kernel by kernel
    from torch.profiler import ProfilerActivity, profile

    res["profile"] = {}
    for label, patched in setups:
        (fastnf4.patch_bitsandbytes if patched else fastnf4.unpatch_bitsandbytes)()
        model = models["fastnf4" if label == "fastnf4" else "bnb"]
        step(model)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step(model)
            torch.cuda.synchronize()
        kernels = {}
        for e in prof.key_averages():
            if e.device_type.name == "CUDA" and e.self_device_time_total > 0:
                kernels[e.key] = (e.self_device_time_total, e.count)
        busy = sum(t for t, _ in kernels.values())
        top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:8]
        res["profile"][label] = {"gpu_busy_us": busy, "kernels": {k: list(v) for k, v in kernels.items()}}
        print(f"{label}: GPU busy {busy / 1e3:.2f} ms in {sum(c for _, c in kernels.values())} kernels; top: "
              + "; ".join(f"{k[:40]} {t / 1e3:.2f} ms x{c}" for k, (t, c) in top), flush=True)
fastnf4.unpatch_bitsandbytes()
best = {label: min(x["step_us"] for x in res["rounds"] if x["setup"] == label) for label, _ in setups}
res["best_step_us"] = best
print("best step (ms): " + ", ".join(f"{k} {v / 1e3:.2f}" for k, v in best.items()) + f"; bnb / bnb+fastnf4 "
      f"{best['bnb'] / best['bnb+fastnf4']:.3f}x, bnb / fastnf4 {best['bnb'] / best['fastnf4']:.3f}x")
if out_json:
    json.dump(res, open(out_json, "w"), indent=1)
