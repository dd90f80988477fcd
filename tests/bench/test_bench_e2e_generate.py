"""``bench e2e --e2e-generate``: generate() timed as users call it beside the compiled rows (CPU: the option, the plan,
the generate arguments and ``generate_speed`` on a tiny fastnf4 Qwen3 with transformers' compile off)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fastnf4.bench import e2e
from helpers import bench_opts


def test_option_parsed_and_needs_the_compiled_mode(monkeypatch, tmp_path):
    opts = bench_opts(monkeypatch, tmp_path, "e2e", "--e2e-modes", "compiled", "--e2e-generate")
    assert opts.e2e_generate is True
    assert e2e.plan(opts, bnb_available=True)["modes"] == ["compiled"]
    assert bench_opts(monkeypatch, tmp_path, "e2e").e2e_generate is False
    with pytest.raises(ValueError, match="--e2e-generate.*compiled"):
        e2e.plan(SimpleNamespace(e2e_modes=["eager", "graph"], e2e_generate=True), bnb_available=True)


def test_generate_kwargs_are_the_static_cache_recipe():
    kw = e2e.generate_kwargs(64)
    assert kw["cache_implementation"] == "static" and kw["do_sample"] is False
    assert kw["max_new_tokens"] == kw["min_new_tokens"] == 64
    assert "disable_compile" not in kw and "compile_config" not in kw  # transformers' own compile, as users get it
    assert e2e.generate_kwargs(8, compiled=False)["disable_compile"] is True
    assert e2e.generate_kwargs(8, compile_config="cfg")["compile_config"] == "cfg"


@pytest.fixture
def tiny_model(monkeypatch):
    transformers = pytest.importorskip("transformers")
    from fastnf4.study.e2e import build_model, fastnf4_linear

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the CPU reference ops; the kernels are tested elsewhere
    cfg = transformers.AutoConfig.for_model("qwen3", vocab_size=96, hidden_size=64, intermediate_size=128,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            head_dim=16)
    torch.manual_seed(0)
    return build_model(cfg, fastnf4_linear, "cpu")


def test_generate_makes_exactly_the_asked_tokens(tiny_model):
    ids = torch.randint(1, 96, (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        out = tiny_model.generate(ids, **e2e.generate_kwargs(7, compiled=False))
    assert out.shape == (2, 12) and torch.equal(out[:, :5], ids)


def test_generate_speed_counts_decode_tokens_of_every_sequence(tiny_model, monkeypatch):
    """decode tok/s = batch * (new - 1) / (median total - median prefill), with the stopwatch faked: each generate
    call (really run) is taken to last 1 ms plus 0.5 ms per new token."""
    ids = torch.randint(1, 96, (3, 4), generator=torch.Generator().manual_seed(2))
    calls = []
    real = tiny_model.generate

    def generate(inp, **kw):
        calls.append(kw["max_new_tokens"])
        return real(inp, **kw)

    monkeypatch.setattr(tiny_model, "generate", generate)

    def wall(fn, n):
        out = []
        for _ in range(n):
            before = len(calls)
            fn()
            out.append(1e-3 + 0.5e-3 * calls[before])
        return out

    monkeypatch.setattr(e2e, "_wall", wall)
    g = e2e.generate_speed(tiny_model, ids, 9, compiled=False)
    assert calls == [9, 9, 9, 9, 1, 1, 1]  # one untimed call, 3 timed, 3 one-token calls
    assert g["decode_tok_per_s"] == pytest.approx(3 * 8 / (5.5e-3 - 1.5e-3))
    with pytest.raises(ValueError, match="new_tokens"):
        e2e.generate_speed(tiny_model, ids, 1)
