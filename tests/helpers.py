import torch

from conftest import bits, poisoned  # noqa: F401

FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def rel_err(y, ref):
    """Relative Frobenius error of ``y`` against a float64 reference."""
    return ((y.double() - ref).norm() / ref.norm()).item()


def random_weight(n, dtype, gen, special=False):
    """Random normal weights; with ``special`` also zeros, NaN, +-Inf, huge and subnormal-scaled blocks."""
    w = torch.randn(n, generator=gen) * 0.05
    if special and n > 300:
        w[:64] = 0
        w[70] = float("nan")
        w[100] = float("inf")
        w[130] = -float("inf")
        w[200:232] = float("nan")
        w[240:272] *= 1e-39
        w[280:296] *= 1e30
    return w.to(dtype)


def random_packed(numel, blocksize, nested, gen):
    """Random packed bytes and statistics for ``numel`` values (fp32 absmax, or uint8 + nested stats)."""
    from fastnf4.codebooks import dynamic_map

    nb = -(-numel // blocksize)
    packed = torch.randint(0, 256, ((numel + 1) // 2,), dtype=torch.uint8, generator=gen)
    if not nested:
        return packed, torch.rand(nb, generator=gen) * 4, None, None, None
    q = torch.randint(0, 256, (nb,), dtype=torch.uint8, generator=gen)
    n2 = -(-nb // 256)
    return packed, q, dynamic_map(), torch.rand(n2, generator=gen) * 2, torch.rand((), generator=gen)


def forward_backward(model, x, g):
    """One forward + backward of ``model`` on ``x`` with output gradient ``g`` (gradients reset first): [output,
    gradient of every parameter that got one]."""
    model.zero_grad(set_to_none=True)
    y = model(x)
    y.backward(g)
    return [y.detach()] + [p.grad for p in model.parameters() if p.grad is not None]


def qlora_recipe(model, peft, fpeft, r):
    """PEFT's QLoRA recipe on a transformers model with fastnf4 layers: prepare_model_for_kbit_training (the other
    parameters upcast to float32), gradient checkpointing (non-reentrant), LoRA of rank ``r`` on "all-linear"."""
    model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if hasattr(model, "activation_checkpointing_enable"):  # the newer transformers' name (the old one warns)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return fpeft.get_peft_model(model, peft.LoraConfig(r=r, target_modules="all-linear"))


def lm_train_losses(model, ids, lr, steps):
    """``steps`` AdamW steps of ``model``'s language-model loss on ``ids`` (the trainable parameters only): the
    losses, one per step."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def bench_opts(monkeypatch, tmp_path, name, *args):
    """The options ``fastnf4 bench NAME ARGS`` hands the benchmark, parsed by the real command line (the benchmark
    itself, the GPU check and the environment faked: no GPU needed)."""
    from fastnf4 import cli
    from fastnf4.bench import harness
    from fastnf4.bench.registry import BENCHMARKS, load_all

    load_all()
    seen = {}

    def fake(opts):
        seen["opts"] = opts
        return {"rows": [], "table": ""}

    monkeypatch.setitem(BENCHMARKS, name, fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(harness, "environment", lambda: {"gpu": "test gpu", "bitsandbytes": None})
    assert cli.main(["bench", name, "--json", str(tmp_path / "out.json"), *args]) == 0
    return seen["opts"]
