"""``bench e2e``'s model builder on CPU (tiny configs, Triton interpreter): the skeleton on ``meta``,
materialised module by module, each linear quantized as soon as it exists; and the bf16 fit estimate."""
import gc
import weakref

import pytest
import torch

transformers = pytest.importorskip("transformers")
from fastnf4.bench.e2e import bf16_skip_note  # noqa: E402
from fastnf4.nn import Linear4bit  # noqa: E402
from fastnf4.study.e2e import bf16_estimate, bnb_linear, build_config, build_model, fastnf4_linear, meta_model  # noqa: E402

TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16)
EXTRA = {"llama": dict(rope_theta=500000.0), "qwen3": dict(rope_theta=1000000.0),
         "gemma3_text": dict(sliding_window=8, query_pre_attn_scalar=16, tie_word_embeddings=True)}


def tiny_config(model_type):
    return transformers.AutoConfig.for_model(model_type, **TINY, **EXTRA[model_type])


def reference(cfg):
    return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()


def finite_logits(model):
    ids = torch.randint(0, TINY["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(ids).logits
    return bool(torch.isfinite(out).all()) and out.float().std().item() > 0


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gemma3_text"])
def test_build_quantizes_every_linear_and_leaves_nothing_on_meta(model_type):
    cfg = tiny_config(model_type)
    model = build_model(cfg, fastnf4_linear, "cpu")
    ref = reference(cfg)
    assert type(model) is type(ref)
    assert sum(isinstance(m, Linear4bit) for m in model.modules()) == 7 * TINY["num_hidden_layers"]
    assert [n for n, m in model.named_modules() if type(m) is torch.nn.Linear] == ["lm_head"]
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        assert t.device.type == "cpu", name
    for name, m in model.named_modules():  # no stray tensor attributes left on meta either
        assert not any(isinstance(v, torch.Tensor) and v.is_meta for v in vars(m).values()), name
    # buffers (rotary inv_freq of every kind, gemma's embedding scale) equal a normally built model's
    bufs, ref_bufs = dict(model.named_buffers()), dict(ref.named_buffers())
    assert bufs.keys() == ref_bufs.keys() and any("inv_freq" in k for k in bufs)
    for k in ref_bufs:
        assert bufs[k].dtype == ref_bufs[k].dtype and torch.equal(bufs[k], ref_bufs[k]), k
    # deterministic parameters (norm weights: ones, or zeros for gemma's 1 + w) equal too
    params = dict(model.named_parameters())
    for k, p in ref.named_parameters():
        if p.numel() > 1 and bool((p == p.flatten()[0]).all()):
            assert torch.equal(params[k], p), k
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight is model.get_input_embeddings().weight
    assert finite_logits(model)


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_bf16_build_matches_architecture(model_type):
    cfg = tiny_config(model_type)
    model, ref = build_model(cfg, None, "cpu"), reference(cfg)
    assert {k: (v.shape, v.dtype) for k, v in model.state_dict().items()} == \
           {k: (v.shape, v.dtype) for k, v in ref.state_dict().items()}
    assert finite_logits(model)


def test_at_most_one_bf16_linear_alive_while_building():
    alive = []

    def replace(layer):
        gc.collect()
        assert sum(r() is not None for r in alive) == 0  # every earlier bf16 weight is gone
        alive.append(weakref.ref(layer.weight))
        return fastnf4_linear(layer)

    build_model(tiny_config("llama"), replace, "cpu")
    assert len(alive) == 7 * TINY["num_hidden_layers"]


def test_bnb_variant_builds():
    pytest.importorskip("bitsandbytes")
    model = build_model(tiny_config("qwen3"), bnb_linear, "cpu")
    assert sum(type(m).__name__ == "Linear4bit" and not isinstance(m, Linear4bit) for m in model.modules()) == 14
    assert type(model.lm_head) is torch.nn.Linear
    assert finite_logits(model)


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_bf16_estimate_counts_the_real_parameter_bytes(model_type):
    cfg = tiny_config(model_type)
    est = bf16_estimate(cfg, batch=4, prompt=10, steps=3)
    real = sum(p.numel() * p.element_size() for p in reference(cfg).parameters())
    assert est["weights"] == real
    assert est["cache"] == 2 * 2 * 4 * 2 * 16 * (10 + 6 + 16) * 2
    assert est["total"] == est["weights"] + est["cache"] + est["activations"] + est["reserve"]


def test_bf16_estimate_of_the_shipped_configs():
    # published parameter counts (text decoder): Llama-3.3-70B 70.55 B, Qwen3-32B 32.76 B
    assert param_count("llama-3.3-70b") == 70_553_706_496
    assert param_count("qwen3-32b") == 32_762_123_264
    cfg = build_config("llama-3.3-70b")
    need = bf16_estimate(cfg, 32, 160, 32)["total"]
    assert bf16_skip_note(cfg, 32, 160, 32, need) is None
    note = bf16_skip_note(cfg, 32, 160, 32, need - 1)
    assert note.startswith("does not fit (estimated ") and "GiB > free" in note


def param_count(name):
    return sum(p.numel() for p in meta_model(build_config(name)).parameters())
