"""fastnf4 through transformers' own from_pretrained / save_pretrained (fastnf4.integrations.hf_quantizer): quantizing
on load (NF4Config), bnb-4bit checkpoints loaded without bitsandbytes (in a subprocess that hides it), checkpoints
saved for transformers + bitsandbytes, PEFT on top, compiled decoding. Tiny Llama / Qwen3 / Gemma3 on CPU; bitsandbytes
runs on the CPU in this process to make the reference checkpoints and results."""
import json
import os
import subprocess
import sys

import pytest
import torch

import fastnf4
from fastnf4.nn import Linear4bit
from helpers import bits, lm_train_losses, qlora_recipe

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402

from fastnf4.integrations import hf_quantizer as hfq  # noqa: E402

ARCHS = ("llama", "qwen3", "gemma3")


def tiny(arch: str, seed: int = 0):
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2)
    cfg = {"llama": lambda: transformers.LlamaConfig(**common),
           "qwen3": lambda: transformers.Qwen3Config(**common, head_dim=16),
           # (tied embeddings; one sliding-window layer shorter than the test prompts)
           "gemma3": lambda: transformers.Gemma3TextConfig(**common, head_dim=16, sliding_window=4,
                                                           layer_types=["sliding_attention", "full_attention"]),
           # (Conv1D layers, stored [in, out], with biases)
           "gpt2": lambda: transformers.GPT2Config(vocab_size=96, n_embd=64, n_layer=2, n_head=4, n_positions=32,
                                                   bos_token_id=0, eos_token_id=0)}[arch]()
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).eval()


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory):
    """arch -> a bf16 checkpoint directory of ``tiny(arch)`` (made once per module)."""
    made = {}

    def get(arch):
        if arch not in made:
            path = tmp_path_factory.mktemp(f"{arch}-bf16")
            tiny(arch).save_pretrained(path)
            made[arch] = str(path)
        return made[arch]

    return get


def load(path, quantization_config=None, **kw):
    kw.setdefault("device_map", "cpu")
    if quantization_config is not None:  # (an explicit None would replace a checkpoint's own quantization_config)
        kw["quantization_config"] = quantization_config
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, **kw).eval()


IDS = torch.tensor([[5, 17, 3, 88, 41, 9, 60, 2, 33], [71, 4, 4, 19, 50, 8, 95, 1, 26]])


def logits(model, ids=IDS):
    with torch.no_grad():
        return model(ids).logits


def four_bit(model) -> set[str]:
    """Names of the 4-bit layers (fastnf4's or bitsandbytes')."""
    kinds = (Linear4bit,)
    try:
        import bitsandbytes as bnb
        kinds += (bnb.nn.Linear4bit,)
    except ImportError:
        pass
    return {n for n, m in model.named_modules() if isinstance(m, kinds)}


def assert_same_state(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(bits(a[k]), bits(b[k])), k


def bnb_plain_cpu_path(model):
    """bitsandbytes' CPU 4-bit layers take its AVX512-BF16 kernel (its own weight repacking and rounding) where the CPU
    has one; switched off here so they compute what bitsandbytes computes on every device: dequantize_4bit, then the
    dense matmul."""
    import bitsandbytes as bnb

    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            m.support_avx512bf16_for_cpu = False
    return model


def bnb_dequantized(model) -> dict[str, torch.Tensor]:
    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    return {n: F.dequantize_4bit(m.weight.data, m.weight.quant_state) for n, m in model.named_modules()
            if isinstance(m, bnb.nn.Linear4bit)}


# ---------------------------------------------------------------------------------------------- quantize on load

@pytest.mark.parametrize("arch", ARCHS)
def test_quantize_on_load_equals_quantize_model(arch, bf16_dir, monkeypatch):
    """from_pretrained(..., quantization_config=NF4Config()) gives fastnf4.quantize_model of the loaded 16-bit model:
    the same layers in 4 bits, the same tensors bit for bit, the same logits. Each layer is quantized when its weight
    arrives, one at a time, between the other tensors' loads (not once the whole 16-bit model is there)."""
    path = bf16_dir(arch)
    seen = []
    real = hfq.FastNF4Quantizer._quantize_into

    def spy(self, model, name, layer, weight):
        pending = [n for n, m in model.named_modules() if isinstance(m, hfq._PendingLinear)]
        done = sum(isinstance(m, Linear4bit) for m in model.modules())
        seen.append((name, done, weight.dtype, [n for n in pending if not model.get_submodule(n).weight.is_meta]))
        return real(self, model, name, layer, weight)

    monkeypatch.setattr(hfq.FastNF4Quantizer, "_quantize_into", spy)
    q = load(path, fastnf4.NF4Config())
    ref = fastnf4.quantize_model(load(path))
    assert four_bit(q) == four_bit(ref) and len(four_bit(ref)) == 14
    assert {n: type(m) for n, m in q.named_modules()} == {n: type(m) for n, m in ref.named_modules()}
    assert_same_state(q.state_dict(), ref.state_dict())
    assert torch.equal(logits(q), logits(ref))
    assert [s[1] for s in seen] == list(range(14))  # quantized one by one as each weight arrived
    assert all(s[2] == torch.bfloat16 and s[3] == [] for s in seen)  # no 16-bit weight kept in the model meanwhile
    if arch == "gemma3":  # the tied output layer stays tied and dense
        assert type(q.lm_head) is torch.nn.Linear and q.lm_head.weight is q.model.embed_tokens.weight
    assert q.is_quantized and q.is_loaded_in_4bit and isinstance(q.hf_quantizer, hfq.FastNF4Quantizer)


def test_conv1d_layers(bf16_dir):
    """GPT-2's Conv1D layers (weights stored [in, out]) are quantized as bitsandbytes quantizes them: the transposed
    weight, [out, in], into a Linear4bit computing x @ W.T + b, i.e. what the Conv1D computed."""
    path = bf16_dir("gpt2")
    q = load(path, fastnf4.NF4Config())
    dense = load(path)
    names = four_bit(q)
    assert len(names) == 8 and all(type(dense.get_submodule(n)).__name__ == "Conv1D" for n in names)
    for n in names:
        ref = fastnf4.quantize(dense.get_submodule(n).weight.detach().t().contiguous())
        assert_same_state(q.get_submodule(n).weight_nf4.state_dict(), ref.state_dict())
        assert torch.equal(q.get_submodule(n).bias, dense.get_submodule(n).bias)
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    layer = q.transformer.h[0].attn.c_proj  # (square: a weight left [in, out] would still fit)
    w = fastnf4.dequantize(layer.weight_nf4)
    with torch.no_grad():
        assert torch.equal(layer(x), torch.nn.functional.linear(x, w, layer.bias))
        exact = dense.transformer.h[0].attn.c_proj(x).float()
        assert (layer(x).float() - exact).norm() < 0.2 * exact.norm()


def test_quantize_on_load_settings(bf16_dir):
    """Non-default settings reach every layer: blocksize, no double quantization, FP4, a compute dtype."""
    path = bf16_dir("llama")
    cfg = fastnf4.NF4Config(blocksize=128, double_quant=False, quant_type="fp4", compute_dtype=torch.float32)
    q = load(path, cfg)
    ref = fastnf4.quantize_model(load(path), blocksize=128, double_quant=False, quant_type="fp4",
                                 compute_dtype=torch.float32)
    assert_same_state(q.state_dict(), ref.state_dict())
    layer = q.model.layers[1].mlp.down_proj
    assert (layer.weight_nf4.blocksize, layer.weight_nf4.nested, layer.weight_nf4.quant_type, layer.compute_dtype) == \
        (128, False, "fp4", torch.float32)
    assert torch.equal(logits(q), logits(ref))


def test_nf4config_fields():
    c = fastnf4.NF4Config(bnb_4bit_quant_type="fp4", bnb_4bit_use_double_quant=False, bnb_4bit_compute_dtype="bfloat16",
                          llm_int8_skip_modules=["q_proj"])
    assert (c.quant_type, c.double_quant, c.compute_dtype, c.modules_to_not_convert) == \
        ("fp4", False, torch.bfloat16, ["q_proj"])
    d = c.to_dict()
    assert d["quant_method"] == "fastnf4" and d["compute_dtype"] == "bfloat16"
    back = fastnf4.NF4Config.from_dict(json.loads(json.dumps(d)))
    assert back.to_dict() == d
    with pytest.raises(ValueError, match="blocksize must be one of"):
        fastnf4.NF4Config(blocksize=48)
    with pytest.raises(ValueError, match="quant_type must be one of"):
        fastnf4.NF4Config(quant_type="int4")
    with pytest.raises(TypeError, match="unexpected arguments .'blocksz'."):
        fastnf4.NF4Config(blocksz=64)
    with pytest.raises(TypeError, match="both quant_type='fp4' and bnb_4bit_quant_type='nf4'"):
        fastnf4.NF4Config(quant_type="fp4", bnb_4bit_quant_type="nf4")


@pytest.mark.parametrize("arch", ARCHS)
def test_skips_what_bitsandbytes_skips(arch, bf16_dir, monkeypatch):
    """The layers left in 16 bits are bitsandbytes' (transformers' quantizer with bitsandbytes installed): by default,
    with a model's _keep_in_fp32_modules, and with the user's modules_to_not_convert / llm_int8_skip_modules."""
    pytest.importorskip("bitsandbytes")
    path = bf16_dir(arch)
    bnb4 = dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)
    skip = ["q_proj", "model.layers.1.mlp"]
    ours = four_bit(load(path, fastnf4.NF4Config()))
    assert ours == four_bit(load(path, BitsAndBytesConfig(**bnb4)))
    assert "lm_head" not in ours and len(ours) == 14
    mine = load(path, fastnf4.NF4Config(modules_to_not_convert=skip))
    theirs = four_bit(load(path, BitsAndBytesConfig(**bnb4, llm_int8_skip_modules=skip)))
    # as in bitsandbytes, a list given replaces transformers' default one: lm_head is quantized then, unless it is tied
    # to the input embedding (Gemma3): fastnf4 keeps it dense and tied, where bitsandbytes' layer fails in its forward
    tied = arch == "gemma3"
    assert four_bit(mine) == theirs - ({"lm_head"} if tied else set())
    assert len(four_bit(mine)) == 9 + (not tied) and not any(n.endswith("q_proj") or ".layers.1.mlp." in n
                                                              for n in four_bit(mine))
    assert not tied or mine.lm_head.weight is mine.model.embed_tokens.weight
    logits(mine)
    monkeypatch.setattr(type(tiny(arch)), "_keep_in_fp32_modules", ["o_proj"])
    kept = four_bit(load(path, fastnf4.NF4Config()))
    assert kept == four_bit(load(path, BitsAndBytesConfig(**bnb4))) and len(kept) == 12


def test_device_maps(bf16_dir):
    """A device_map as transformers takes it (per module); what fastnf4 cannot place is refused before loading."""
    path = bf16_dir("llama")
    split = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu", "model.layers.1": "cpu",
             "model.norm": "cpu", "lm_head": "cpu"}
    ref = load(path, fastnf4.NF4Config())
    q = load(path, fastnf4.NF4Config(), device_map=split)
    assert torch.equal(logits(q), logits(ref))
    with pytest.raises(ValueError, match="does not offload 4-bit layers to disk"):
        load(path, fastnf4.NF4Config(), device_map={**split, "model.layers.1": "disk"})
    with pytest.raises(ValueError, match="some modules on the CPU and others on GPUs"):
        load(path, fastnf4.NF4Config(), device_map={**split, "model.layers.1": 0})


# ---------------------------------------------------------------------------------------------- bnb-4bit checkpoints

_NO_BNB = r"""
import sys
sys.modules["bitsandbytes"] = None  # an import of bitsandbytes fails from here on
import json, torch, transformers
from safetensors.torch import save_file
import fastnf4, fastnf4.integrations.hf_quantizer as hfq
from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING
assert AUTO_QUANTIZER_MAPPING["bitsandbytes_4bit"] is hfq.FastNF4Quantizer
path, out, ids = sys.argv[1], sys.argv[2], torch.tensor(json.loads(sys.argv[3]))
m = transformers.AutoModelForCausalLM.from_pretrained(path, device_map="cpu").eval()
with torch.no_grad():
    lg = m(ids).logits
res = {"logits": lg}
res.update({"dq." + n: fastnf4.dequantize(l.weight_nf4) for n, l in m.named_modules() if isinstance(l, fastnf4.Linear4bit)})
res.update({"sd." + k: v.clone() for k, v in m.state_dict().items()})  # (clones: tied tensors share memory)
save_file(res, out)
m.save_pretrained(sys.argv[4])
print(type(m.hf_quantizer).__name__, m.config.quantization_config.quant_method.value)
"""


def run_without_bitsandbytes(path, out, resaved):
    r = subprocess.run([sys.executable, "-c", _NO_BNB, str(path), str(out), json.dumps(IDS.tolist()), str(resaved)],
                       capture_output=True, text=True, env={**os.environ}, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-2:] == ["FastNF4Quantizer", "bitsandbytes"], r.stdout
    from safetensors.torch import load_file

    return load_file(str(out))


@pytest.mark.parametrize("arch,compute", [("llama", None), ("qwen3", torch.bfloat16), ("gemma3", torch.bfloat16),
                                          ("gpt2", None)])
def test_bnb_checkpoint_loads_without_bitsandbytes(arch, compute, bf16_dir, tmp_path):
    """A checkpoint bitsandbytes wrote (quantized on load by transformers + bitsandbytes, saved with save_pretrained)
    loads through from_pretrained where bitsandbytes cannot be imported: fastnf4 layers whose dequantized weights are
    bitsandbytes' own load's bit for bit, the other tensors the same, the same logits (computed in the checkpoint's
    bnb_4bit_compute_dtype, float32 where it names none, as bitsandbytes does); saved again, the same tensors."""
    pytest.importorskip("bitsandbytes")
    bnb_cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                 bnb_4bit_compute_dtype=compute)
    load(bf16_dir(arch), bnb_cfg).save_pretrained(tmp_path / "bnb")
    theirs = bnb_plain_cpu_path(load(tmp_path / "bnb"))
    got = run_without_bitsandbytes(tmp_path / "bnb", tmp_path / "out.safetensors", tmp_path / "resaved")
    ref = bnb_dequantized(theirs)
    assert len(ref) == (8 if arch == "gpt2" else 14)
    assert_same_state({k[3:]: v for k, v in got.items() if k.startswith("dq.")}, ref)
    plain = {k: v for k, v in theirs.state_dict().items() if ".weight." not in k and k.rpartition(".")[0] not in ref}
    assert_same_state({k[3:]: v for k, v in got.items() if k.startswith("sd.") and k[3:] in plain}, plain)
    assert torch.equal(got["logits"], logits(theirs))
    from safetensors.torch import load_file  # what it saves is what it read (transformers + bitsandbytes 5.24 cannot
    assert_same_state(load_file(str(tmp_path / "resaved" / "model.safetensors")),  # re-save such a model at all)
                      load_file(str(tmp_path / "bnb" / "model.safetensors")))


def test_routing_with_bitsandbytes_installed(bf16_dir, tmp_path):
    """With bitsandbytes importable, bnb-4bit checkpoints stay with transformers' bitsandbytes quantizer;
    register(bitsandbytes=True) takes them over, unregister() gives them back."""
    bnb = pytest.importorskip("bitsandbytes")
    from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING
    from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer

    load(bf16_dir("llama"), fastnf4.NF4Config()).save_pretrained(tmp_path / "nf4")
    assert hfq.register() is False and AUTO_QUANTIZER_MAPPING["bitsandbytes_4bit"] is Bnb4BitHfQuantizer
    assert isinstance(load(tmp_path / "nf4").model.layers[0].mlp.up_proj, bnb.nn.Linear4bit)
    try:
        assert hfq.register(bitsandbytes=True) is True
        assert isinstance(load(tmp_path / "nf4").model.layers[0].mlp.up_proj, Linear4bit)
    finally:
        hfq.unregister()
    assert AUTO_QUANTIZER_MAPPING["bitsandbytes_4bit"] is Bnb4BitHfQuantizer
    assert isinstance(load(tmp_path / "nf4").model.layers[0].mlp.up_proj, bnb.nn.Linear4bit)


# ---------------------------------------------------------------------------------------------- save

@pytest.mark.parametrize("arch", ARCHS + ("gpt2",))
def test_save_pretrained_for_bitsandbytes_and_back(arch, bf16_dir, tmp_path):
    """save_pretrained of a model quantized on load writes bitsandbytes' checkpoint: its config JSON (every field
    BitsAndBytesConfig writes, the 16-bit layers by full name), its tensor names. transformers + bitsandbytes load it
    with 4-bit layers exactly where fastnf4 has them and the same logits; fastnf4 loads it back bit for bit."""
    pytest.importorskip("bitsandbytes")
    q = load(bf16_dir(arch), fastnf4.NF4Config())
    q.save_pretrained(tmp_path / "nf4")
    qc = json.load(open(tmp_path / "nf4" / "config.json"))["quantization_config"]
    model_dtype_name = "bfloat16"
    expected = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                  bnb_4bit_compute_dtype=model_dtype_name, llm_int8_skip_modules=["lm_head"]).to_dict()
    assert qc == expected
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "nf4" / "model.safetensors"))
    first = sorted(four_bit(q))[0]
    assert {k for k in saved if k.startswith(first + ".weight")} == {f"{first}.weight{s}" for s in (
        "", ".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map", ".quant_state.bitsandbytes__nf4")}
    theirs = bnb_plain_cpu_path(load(tmp_path / "nf4"))
    assert four_bit(theirs) == four_bit(q)
    assert torch.equal(logits(theirs), logits(q))
    assert_same_state(bnb_dequantized(theirs), {n: fastnf4.dequantize(m.weight_nf4) for n, m in q.named_modules()
                                                if isinstance(m, Linear4bit)})
    try:
        hfq.register(bitsandbytes=True)
        back = load(tmp_path / "nf4")
    finally:
        hfq.unregister()
    assert four_bit(back) == four_bit(q) and all(isinstance(back.get_submodule(n), Linear4bit) for n in four_bit(q))
    assert_same_state(back.state_dict(), q.state_dict())
    assert torch.equal(logits(back), logits(q))


def test_quantize_model_then_save_pretrained(bf16_dir, tmp_path):
    """A model quantized with fastnf4.quantize_model saves the same checkpoint once attach() gave it the config."""
    path = bf16_dir("qwen3")
    load(path, fastnf4.NF4Config()).save_pretrained(tmp_path / "a")
    model = fastnf4.quantize_model(load(path))
    assert hfq.attach(model) is model and model.is_loaded_in_4bit
    model.save_pretrained(tmp_path / "b")
    from safetensors.torch import load_file

    assert_same_state(load_file(str(tmp_path / "a" / "model.safetensors")),
                      load_file(str(tmp_path / "b" / "model.safetensors")))
    cfg = lambda d: json.load(open(tmp_path / d / "config.json"))["quantization_config"]  # noqa: E731
    assert cfg("a") == cfg("b")
    with pytest.raises(ValueError, match="no fastnf4 Linear4bit layers"):
        hfq.attach(load(path))


# ---------------------------------------------------------------------------------------------- PEFT, compile

def test_peft_lora_on_a_model_quantized_on_load(bf16_dir):
    """PEFT's QLoRA recipe (fastnf4.integrations.peft) on a model from from_pretrained(NF4Config): the same training
    losses as on fastnf4.quantize_model of the same checkpoint, and the adapters learn."""
    peft = pytest.importorskip("peft")
    from fastnf4.integrations import peft as fpeft

    path = bf16_dir("llama")
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(3))
    runs = []
    for model in (load(path, fastnf4.NF4Config(compute_dtype=torch.bfloat16)),
                  fastnf4.quantize_model(load(path), compute_dtype=torch.bfloat16)):
        torch.manual_seed(5)
        model = qlora_recipe(model, peft, fpeft, r=4)
        assert sum(type(m).__name__ == "LoraLinear4bit" for m in model.modules()) == 14
        runs.append(lm_train_losses(model, ids, lr=1e-2, steps=3))
    assert runs[0] == runs[1] and runs[0][-1] < runs[0][0], runs


def test_compiled_static_cache_decoding_has_no_graph_break(bf16_dir, monkeypatch):
    """A model quantized on load, decoding with a static cache under torch.compile(fullgraph=True) (aot_eager, CPU,
    fastnf4's PyTorch reference path: TRITON_INTERPRET unset): one graph without a break, and the logits of the same
    model dequantized (model.dequantize(): dense layers holding fastnf4.dequantize's weights) compiled the same way.
    (Compiled against eager is not bit-exact with transformers 5.17: its compiled static-cache attention runs over the
    whole cache with a mask, its eager one over the filled part; 5.24 gives the eager logits too.)"""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    torch._dynamo.reset()
    model = load(bf16_dir("llama"), fastnf4.NF4Config())
    assert model.hf_quantizer.is_compileable
    dense = load(bf16_dir("llama"), fastnf4.NF4Config()).dequantize()
    assert not four_bit(dense) and not hasattr(dense.config, "quantization_config")

    def decode(m, forward):
        cache = transformers.StaticCache(config=m.config, max_cache_len=16)
        out = []
        with torch.no_grad():
            y = forward(IDS[:1, :5], past_key_values=cache, use_cache=True, cache_position=torch.arange(5)).logits
            out.append(y)
            for i in range(2):
                tok = y[:, -1:].argmax(-1)
                y = forward(tok, past_key_values=cache, use_cache=True, cache_position=torch.tensor([5 + i])).logits
                out.append(y)
        return out

    compiled = decode(model, torch.compile(model.forward, fullgraph=True, backend="aot_eager"))
    reference = decode(dense, torch.compile(dense.forward, fullgraph=True, backend="aot_eager"))
    assert all(torch.equal(a, b) for a, b in zip(compiled, reference))
    cache = transformers.StaticCache(config=model.config, max_cache_len=16)
    with torch.no_grad():
        model(IDS[:1, :5], past_key_values=cache, use_cache=True, cache_position=torch.arange(5))
        explained = torch._dynamo.explain(model.forward)(IDS[:1, 5:6], past_key_values=cache, use_cache=True,
                                                         cache_position=torch.tensor([5]))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    torch._dynamo.reset()
