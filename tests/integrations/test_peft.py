"""PEFT LoRA on fastnf4's own NF4 layers (fastnf4.integrations.peft): the LoRA layer's output and adapter gradients
against a float64 computation on the dequantized weight, training, disabling, merging and a saved adapter loaded
back. On CPU the NF4 matmuls run the Triton kernels in the interpreter."""
import pytest
import torch

import fastnf4
from fastnf4 import _triton
from helpers import lm_train_losses, qlora_recipe, rel_err

peft = pytest.importorskip("peft")
from fastnf4.integrations import peft as fpeft  # noqa: E402

needs_triton = pytest.mark.skipif(not _triton.use_triton(torch.device("cpu")), reason="needs TRITON_INTERPRET=1")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(64, 48, bias=False)
        self.v = torch.nn.Linear(48, 64)
        self.head = torch.nn.Linear(64, 8)

    def forward(self, x):
        return self.head(torch.nn.functional.gelu(self.v(torch.nn.functional.gelu(self.q(x)))))


def nf4_model(seed=0):
    torch.manual_seed(seed)
    return fastnf4.quantize_model(Block(), skip=("head",))


def lora(model, seed=1, **kw):
    torch.manual_seed(seed)
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q", "v"], init_lora_weights=False, **kw)
    return fpeft.get_peft_model(model, cfg)


@needs_triton
def test_lora_layer_output_and_gradients(rng):
    model = lora(nf4_model())
    layer = model.base_model.model.q
    assert type(layer).__name__ == "LoraLinear4bit" and isinstance(layer.base_layer, fastnf4.nn.Linear4bit)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"base_model.model.{m}.lora_{ab}.default.weight" for m in ("q", "v") for ab in "AB"}

    x = torch.randn(5, 64, generator=rng, requires_grad=True)
    y = layer(x)
    g = torch.randn(5, 48, generator=rng)
    y.backward(g)
    # float64 reference: the dequantized weight plus the adapter, by autograd
    w = fastnf4.dequantize(layer.base_layer.weight_nf4).double()
    a = layer.lora_A["default"].weight.detach().double().requires_grad_()
    b = layer.lora_B["default"].weight.detach().double().requires_grad_()
    xd = x.detach().double().requires_grad_()
    ref = xd @ w.T + (xd @ a.T @ b.T) * layer.scaling["default"]
    ref.backward(g.double())
    assert rel_err(y, ref.detach()) < 1e-5
    assert rel_err(x.grad, xd.grad) < 1e-5
    assert rel_err(layer.lora_A["default"].weight.grad, a.grad) < 1e-5
    assert rel_err(layer.lora_B["default"].weight.grad, b.grad) < 1e-5


@needs_triton
def test_training_disable_and_merge(rng):
    model = lora(nf4_model())
    x = torch.randn(16, 64, generator=rng)
    target = torch.randn(16, 8, generator=rng)
    frozen = model.base_model.model.q.base_layer.weight_nf4.packed_u8.clone()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(6):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses
    assert torch.equal(model.base_model.model.q.base_layer.weight_nf4.packed_u8, frozen)

    with torch.no_grad():
        tuned = model(x)
        with model.disable_adapter():  # exactly the NF4 model without adapters
            plain = model(x)
        base = nf4_model()
        base.head.load_state_dict(model.base_model.model.head.state_dict())
        assert torch.equal(plain, base(x))
        # merged: the weight dequant(W) + B A s quantized again (one more round of 4-bit rounding)
        layer = model.base_model.model.q
        want = fastnf4.dequantize(layer.base_layer.weight_nf4) + layer.get_delta_weight("default")
        with pytest.warns(UserWarning, match="quantizes the merged weight"):
            merged = model.merge_and_unload()
        assert isinstance(merged.q, fastnf4.nn.Linear4bit) and isinstance(merged.v, fastnf4.nn.Linear4bit)
        got = fastnf4.dequantize(merged.q.weight_nf4)
        assert rel_err(got, want.double()) < 0.15  # NF4's own rounding error on such weights is ~0.1
        assert rel_err(merged(x), tuned.double()) < 0.1
        assert rel_err(merged(x), plain.double()) > 2 * rel_err(merged(x), tuned.double())  # the adapter is in


@needs_triton
def test_saved_adapter_loads_back(tmp_path, rng):
    model = lora(nf4_model())
    x = torch.randn(4, 64, generator=rng)
    with torch.no_grad():
        want = model(x)
    model.save_pretrained(tmp_path)
    config = fpeft.register(peft.LoraConfig.from_pretrained(tmp_path))
    loaded = peft.PeftModel.from_pretrained(nf4_model(), tmp_path, config=config)
    with torch.no_grad():
        assert torch.equal(loaded(x), want)


def test_unsupported_settings_are_refused():
    with pytest.raises(ValueError, match="lora_bias"):
        lora(nf4_model(), lora_bias=True)
    with pytest.raises(ValueError, match="use_dora|variant"):
        lora(nf4_model(), use_dora=True)
    with pytest.raises(TypeError, match="LoraConfig"):
        fpeft.register(object())
    for init in ("pissa", "olora", "orthogonal"):
        with pytest.raises(ValueError, match=f"init_lora_weights='{init}'"):
            fpeft.get_peft_model(nf4_model(), peft.LoraConfig(r=4, target_modules=["q", "v"], init_lora_weights=init))


@needs_triton
def test_all_linear_takes_the_nf4_layers():
    """PEFT's "all-linear" knows only its own layer types; fastnf4's get_peft_model counts the NF4 layers as linear
    (and, for a transformers model, leaves lm_head out as PEFT does)."""
    model = fpeft.get_peft_model(nf4_model(), peft.LoraConfig(r=4, target_modules="all-linear"))
    from peft.tuners.lora.layer import Linear as LoraLinear

    inner = model.base_model.model
    assert type(inner.q).__name__ == type(inner.v).__name__ == "LoraLinear4bit"
    assert type(inner.head) is LoraLinear  # a dense nn.Linear of a plain module: PEFT's own LoRA layer, as PEFT does
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    llama = fastnf4.quantize_model(transformers.LlamaForCausalLM(cfg))  # lm_head stays dense (DEFAULT_SKIP)
    wrapped = fpeft.get_peft_model(llama, peft.LoraConfig(r=4, target_modules="all-linear"))
    lora_layers = {n.rsplit(".", 1)[-1] for n, m in wrapped.named_modules() if type(m).__name__ == "LoraLinear4bit"}
    assert lora_layers == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert type(wrapped.base_model.model.lm_head) is torch.nn.Linear  # not wrapped


@needs_triton
def test_qlora_recipe_on_fastnf4_layers(monkeypatch, rng):
    """The usual QLoRA recipe on a transformers model with fastnf4 layers: prepare_model_for_kbit_training (which
    upcasts the other parameters to float32), a bf16 compute dtype on the NF4 layers (as bnb_4bit_compute_dtype),
    gradient checkpointing, all-linear LoRA: a training step runs, the NF4 matmuls stay bf16, the adapters learn."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = fastnf4.quantize_model(transformers.LlamaForCausalLM(cfg).to(torch.bfloat16), compute_dtype=torch.bfloat16)
    model = qlora_recipe(model, peft, fpeft, r=4)
    seen = []
    real = fastnf4.nn.linear

    def recording(x, q, bias=None):
        seen.append(x.dtype)
        return real(x, q, bias)

    monkeypatch.setattr(fastnf4.nn, "linear", recording)
    losses = lm_train_losses(model, torch.randint(0, 128, (2, 16), generator=rng), lr=1e-2, steps=4)
    assert seen and set(seen) == {torch.bfloat16}  # the NF4 matmuls, in forward and in the checkpointed recompute
    assert model.base_model.model.model.norm.weight.dtype == torch.float32  # what the recipe does to the rest
    assert losses[-1] < losses[0], losses


@needs_triton
def test_two_adapters_and_mixed_batches(rng):
    """Two adapters on the same NF4 layers: switching between them, and one batch whose rows use different adapters
    (``adapter_names``, PEFT's mixed-batch inference) gives each row what that adapter gives it alone."""
    model = lora(nf4_model())
    torch.manual_seed(2)
    model.add_adapter("other", peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q", "v"], init_lora_weights=False))
    x = torch.randn(3, 64, generator=rng)
    model.eval()  # mixed batches are an inference feature (PEFT refuses them in training mode)
    with torch.no_grad():
        alone = {}
        for name in ("default", "other"):
            model.set_adapter(name)
            alone[name] = model(x)
        with model.disable_adapter():
            alone["__base__"] = model(x)
        assert not torch.equal(alone["default"], alone["other"])
        mixed = model(x, adapter_names=["other", "__base__", "default"])
    for row, name in enumerate(("other", "__base__", "default")):
        assert torch.allclose(mixed[row], alone[name][row], rtol=1e-5, atol=1e-6), name
