"""fastnf4 layers in transformers models: swap, load while quantizing, save/load bnb-4bit checkpoints (no
bitsandbytes needed), torch.compile. Tiny configs on CPU (Triton interpreter)."""
import os
import subprocess
import sys

import pytest
import torch

import fastnf4
from fastnf4.nn import Linear4bit, quantize_model
from helpers import bits

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from fastnf4.integrations.transformers import load_and_quantize, load_quantized, save_quantized  # noqa: E402


def tiny_llama(seed=0):
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


@pytest.fixture
def checkpoint(tmp_path):
    model = tiny_llama()
    model.save_pretrained(tmp_path / "bf16")
    return model, str(tmp_path / "bf16")


def test_quantize_model_swaps_every_linear_but_lm_head():
    model = quantize_model(tiny_llama())
    assert sum(isinstance(m, Linear4bit) for m in model.modules()) == 14
    assert type(model.lm_head) is torch.nn.Linear
    # each layer computes x @ dequantize(W).T within the matmul error bound
    layer = model.model.layers[0].mlp.down_proj
    x = torch.randn(5, layer.in_features).to(torch.bfloat16)
    wd = fastnf4.dequantize(layer.weight_nf4)
    ref = x.double() @ wd.double().T
    err = lambda y: ((y.double() - ref).norm() / ref.norm()).item()  # noqa: E731
    assert err(layer(x)) <= 2 * err(torch.nn.functional.linear(x, wd))


def test_load_and_quantize_equals_quantizing_the_loaded_model(checkpoint):
    model, path = checkpoint
    q = load_and_quantize(path, device="cpu")
    ref = quantize_model(tiny_llama())
    for (n, a), (_, b) in zip(q.named_modules(), ref.named_modules()):
        if isinstance(a, Linear4bit):
            assert isinstance(b, Linear4bit) and torch.equal(a.weight_nf4.packed, b.weight_nf4.packed), n
    sq, sr = q.state_dict(), ref.state_dict()
    assert sq.keys() == sr.keys()
    for k in sq:
        assert sq[k].dtype == sr[k].dtype and torch.equal(sq[k], sr[k]), k


def test_save_and_load_round_trip(checkpoint, tmp_path):
    _, path = checkpoint
    q = load_and_quantize(path, device="cpu")
    save_quantized(q, str(tmp_path / "nf4"))
    cfg = transformers.AutoConfig.from_pretrained(str(tmp_path / "nf4"))
    qc = cfg.quantization_config if isinstance(cfg.quantization_config, dict) else cfg.quantization_config.to_dict()
    assert qc["quant_method"] == "bitsandbytes" and qc["load_in_4bit"] and qc["bnb_4bit_quant_type"] == "nf4"
    q2 = load_quantized(str(tmp_path / "nf4"), device="cpu")
    ids = torch.randint(0, 96, (1, 9))
    assert torch.equal(logits(q2, ids), logits(q, ids))


def test_device_map_plan():
    """``device_map`` as transformers spells it: whole modules, "" for the rest, the longest mapped name wins; the
    plan covers the model with no name inside another, and bad maps are refused by name."""
    from fastnf4.integrations.transformers import _device_of, _device_plan

    model = tiny_llama()
    cpu = torch.device("cpu")
    plan = _device_plan(model, "cuda", {"": "cpu", "model.layers.1": "cpu", "lm_head": "cpu"})
    assert sorted(plan) == ["lm_head", "model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm",
                            "model.rotary_emb"]
    assert set(plan.values()) == {cpu}
    assert _device_of(plan, "model.layers.1.mlp.up_proj") == cpu
    assert _device_plan(model, "cpu", None) == {"": cpu}
    with pytest.raises(ValueError, match="no device for 'model.embed_tokens'"):
        _device_plan(model, "cpu", {"model.layers": "cpu", "model.norm": "cpu", "lm_head": "cpu"})
    with pytest.raises(ValueError, match="does not have.*model.layers.7"):
        _device_plan(model, "cpu", {"": "cpu", "model.layers.7": "cpu"})
    with pytest.raises(ValueError, match="mixes CPU and GPUs"):
        _device_plan(model, "cpu", {"": "cpu", "model.layers.1": "cuda:1"})
    with pytest.raises(ValueError, match="dict, \"balanced\" or \"auto\""):
        _device_plan(model, "cpu", "sequential")
    if not torch.cuda.is_available():
        for how in ("balanced", "auto"):
            with pytest.raises(ValueError, match=f"device_map='{how}' needs CUDA GPUs"):
                _device_plan(model, "cpu", how)


def test_load_with_a_device_map(checkpoint, tmp_path):
    _, path = checkpoint
    split = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers": "cpu", "model.norm": "cpu",
             "lm_head": "cpu"}
    q = load_and_quantize(path, device="cpu")
    save_quantized(q, str(tmp_path / "nf4"))
    ids = torch.randint(0, 96, (1, 9))
    assert torch.equal(logits(load_and_quantize(path, device_map=split), ids), logits(q, ids))
    assert torch.equal(logits(load_quantized(str(tmp_path / "nf4"), device_map=split), ids), logits(q, ids))


def test_saved_layers_read_back_by_bitsandbytes(checkpoint, tmp_path):
    F = pytest.importorskip("bitsandbytes.functional")
    from safetensors.torch import load_file

    _, path = checkpoint
    q = load_and_quantize(path, device="cpu")
    save_quantized(q, str(tmp_path / "nf4"))
    sd = load_file(str(tmp_path / "nf4" / "model.safetensors"))
    prefix = "model.layers.1.self_attn.o_proj.weight"
    qs = F.QuantState.from_dict({k[len(prefix) + 1:]: v for k, v in sd.items() if k.startswith(prefix + ".")}, "cpu")
    theirs = F.dequantize_4bit(sd[prefix], qs)
    ours = fastnf4.dequantize(q.model.layers[1].self_attn.o_proj.weight_nf4)
    assert torch.equal(bits(theirs), bits(ours))


def test_load_quantized_needs_no_bitsandbytes(checkpoint, tmp_path):
    _, path = checkpoint
    save_quantized(load_and_quantize(path, device="cpu"), str(tmp_path / "nf4"))
    code = ("import sys; sys.modules['bitsandbytes'] = None\n"
            "import torch\n"
            "from fastnf4.integrations.transformers import load_quantized\n"
            f"m = load_quantized({str(tmp_path / 'nf4')!r}, device='cpu')\n"
            "print(type(m.model.layers[0].mlp.up_proj).__name__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ}, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().endswith("Linear4bit")


def test_compiled_forward_has_no_graph_break():
    model = quantize_model(tiny_llama())
    layer = model.model.layers[0].mlp
    x = torch.randn(1, 3, 64).to(torch.bfloat16)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        assert torch.equal(compiled(x), layer(x))


def test_linear4bit_computes_in_compute_dtype_and_returns_the_input_dtype(rng):
    """As bitsandbytes' Linear4bit: x is cast to compute_dtype for the matmul and the result back to x's dtype."""
    q = fastnf4.quantize((torch.randn(24, 64, generator=rng) * 0.05).to(torch.bfloat16))
    bias = (torch.randn(24, generator=rng) * 0.1).to(torch.bfloat16)
    layer = Linear4bit(q, bias, compute_dtype=torch.bfloat16)
    x = torch.randn(3, 64, generator=rng)  # float32 activations
    y = layer(x)
    assert y.dtype == torch.float32
    assert torch.equal(y, fastnf4.linear(x.to(torch.bfloat16), q, bias).float())
    assert Linear4bit(q, bias)(x.to(torch.bfloat16)).dtype == torch.bfloat16  # default: compute in x's dtype
    with torch.autocast("cpu", dtype=torch.bfloat16):  # ... or in autocast's, where it is on (as nn.Linear would)
        y = Linear4bit(q, bias)(x)
    assert y.dtype == torch.float32 and torch.equal(y, fastnf4.linear(x.to(torch.bfloat16), q, bias).float())


def _bnb_layers(model):
    """{module name: True for a bitsandbytes 4-bit layer, False for a plain nn.Linear} of a model transformers loaded."""
    import bitsandbytes as bnb

    return {n: isinstance(m, bnb.nn.Linear4bit) for n, m in model.named_modules()
            if isinstance(m, (bnb.nn.Linear4bit, torch.nn.Linear))}


def test_partly_quantized_model_saved_in_shards(checkpoint, tmp_path):
    """One linear left in 16 bits (by its full name in the config: a leaf name would keep every layer of that name out
    of 4 bits in transformers), the tensors written in shards with an index; read back by fastnf4 with the same logits
    and by transformers + bitsandbytes with exactly that layer dense. The model itself is left unchanged."""
    pytest.importorskip("bitsandbytes")
    dense = "model.layers.0.self_attn.q_proj"
    q = load_and_quantize(checkpoint[1], device="cpu", skip=("lm_head", dense))
    save_quantized(q, str(tmp_path / "nf4"), max_shard_bytes=20_000)
    assert not hasattr(q.config, "quantization_config")
    files = sorted(os.listdir(tmp_path / "nf4"))
    assert "model.safetensors.index.json" in files and "model.safetensors" not in files
    assert sum(f.startswith("model-") for f in files) > 2
    qc = transformers.AutoConfig.from_pretrained(str(tmp_path / "nf4")).quantization_config
    qc = qc if isinstance(qc, dict) else qc.to_dict()
    assert qc["llm_int8_skip_modules"] == ["lm_head", dense]
    ids = torch.randint(0, 96, (1, 9))
    assert torch.equal(logits(load_quantized(str(tmp_path / "nf4"), device="cpu"), ids), logits(q, ids))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "nf4"), dtype=torch.bfloat16)
    kinds = _bnb_layers(theirs)
    assert {n for n, is4 in kinds.items() if not is4} == {dense, "lm_head"} and sum(kinds.values()) == 13


def test_every_linear_quantized_and_tied_output_layers():
    """skip=() quantizes lm_head too, and the config says so ([], not None: None means transformers' default list);
    an output layer tied to the embedding stays dense (as transformers keeps it), so the model stays tied."""
    q = quantize_model(tiny_llama(), skip=())
    assert isinstance(q.lm_head, Linear4bit)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(1)
    tied = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    quantize_model(tied, skip=())
    assert type(tied.lm_head) is torch.nn.Linear and tied.lm_head.weight is tied.model.embed_tokens.weight
    assert sum(isinstance(m, Linear4bit) for m in tied.modules()) == 14


def test_save_all_linears_and_load_back(checkpoint, tmp_path):
    q = load_and_quantize(checkpoint[1], device="cpu", skip=())
    save_quantized(q, str(tmp_path / "nf4"))
    qc = transformers.AutoConfig.from_pretrained(str(tmp_path / "nf4")).quantization_config
    qc = qc if isinstance(qc, dict) else qc.to_dict()
    assert qc["llm_int8_skip_modules"] == []
    ids = torch.randint(0, 96, (1, 9))
    assert torch.equal(logits(load_quantized(str(tmp_path / "nf4"), device="cpu"), ids), logits(q, ids))


def test_checkpoint_directories_as_found_in_the_wild(checkpoint, tmp_path):
    """A repository with another safetensors file beside the transformers one (Mistral's consolidated.safetensors)
    and a tensor the model has no place for (an older checkpoint's rotary_emb.inv_freq): the loaders read the files
    transformers reads and skip (with a warning) what the model lacks, as transformers does."""
    from safetensors.torch import load_file, save_file

    _, path = checkpoint
    ref = load_and_quantize(path, device="cpu")
    sd = load_file(os.path.join(path, "model.safetensors"))
    save_file({"tok_embeddings.weight": torch.zeros(3, 3)}, os.path.join(path, "consolidated.safetensors"))
    save_file({**sd, "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)},
              os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with pytest.warns(UserWarning, match="rotary_emb.inv_freq") as seen:
        q = load_and_quantize(path, device="cpu")
    assert not any("tok_embeddings" in str(w.message) for w in seen)  # consolidated.safetensors was not read
    ids = torch.randint(0, 96, (1, 9))
    assert torch.equal(logits(q, ids), logits(ref, ids))


def _tiny(arch: str):
    """A tiny random model of another architecture: Qwen2 (biases in q/k/v), Gemma2 (tied embeddings, soft-capping),
    Phi3 (fused qkv and gate_up projections)."""
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2)
    cfg = {"qwen2": lambda: transformers.Qwen2Config(**common),
           "gemma2": lambda: transformers.Gemma2Config(**common, head_dim=16),
           "phi3": lambda: transformers.Phi3Config(**common, pad_token_id=0)}[arch]()
    torch.manual_seed(3)
    return transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).eval()


@pytest.mark.parametrize("arch", ["qwen2", "gemma2", "phi3"])
def test_other_architectures_round_trip(arch, tmp_path):
    """Quantized while loading, saved, loaded back: the same logits; every linear but the (possibly tied) output
    layer in 4 bits, biases kept, tied weights still tied."""
    model = _tiny(arch)
    model.save_pretrained(tmp_path / "bf16")
    q = load_and_quantize(str(tmp_path / "bf16"), device="cpu")
    n_linear = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert sum(isinstance(m, Linear4bit) for m in q.modules()) == n_linear - 1
    if getattr(model.config, "tie_word_embeddings", False):
        assert q.lm_head.weight is q.get_input_embeddings().weight
    if arch == "qwen2":
        assert q.model.layers[0].self_attn.q_proj.bias is not None
    save_quantized(q, str(tmp_path / "nf4"))
    ids = torch.randint(0, 96, (1, 9))
    assert torch.equal(logits(load_quantized(str(tmp_path / "nf4"), device="cpu"), ids), logits(q, ids))


def _edit(path, change):
    """Rewrite the checkpoint's model.safetensors with ``change(state dict)`` applied."""
    from safetensors.torch import load_file, save_file

    f = os.path.join(path, "model.safetensors")
    sd = load_file(f)
    change(sd)
    save_file(sd, f, metadata={"format": "pt"})


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return str(dst)


def test_tensors_of_another_shape_or_kind_are_refused(checkpoint, tmp_path):
    """As transformers: a checkpoint tensor whose shape differs from the model's is an error naming it (it used to be
    installed as it was: a (1,) norm weight broadcast silently), for plain tensors, 16-bit linears and 4-bit layers."""
    _, path = checkpoint
    nf4 = str(tmp_path / "nf4")
    save_quantized(load_and_quantize(path, device="cpu"), nf4)
    cases = [
        ("model.norm.weight", lambda sd: sd.__setitem__("model.norm.weight", torch.full((1,), 2.0, dtype=torch.bfloat16)),
         ValueError, r"model.norm.weight: the checkpoint's tensor has shape \(1,\), the model's \(64,\)"),
        ("lm_head", lambda sd: sd.__setitem__("lm_head.weight", sd["lm_head.weight"][:48].clone()),
         ValueError, r"lm_head.weight: the checkpoint's tensor has shape \(48, 64\)"),
        ("norm int", lambda sd: sd.__setitem__("model.norm.weight", torch.ones(64, dtype=torch.int32)),
         TypeError, "model.norm.weight: the checkpoint's tensor is torch.int32"),
    ]
    for i, (what, change, exc, words) in enumerate(cases):
        for src, load in ((path, load_and_quantize), (nf4, load_quantized)):
            d = _copy(src, tmp_path / f"{i}-{load.__name__}")
            _edit(d, change)
            with pytest.raises(exc, match=words):
                load(d, device="cpu")
    d = _copy(path, tmp_path / "up")  # a 16-bit linear weight of another shape, before it is quantized
    _edit(d, lambda sd: sd.__setitem__("model.layers.0.mlp.up_proj.weight", torch.zeros(64, 128, dtype=torch.bfloat16)))
    with pytest.raises(ValueError, match=r"up_proj.weight: .*shape \(64, 128\).*\(128, 64\)"):
        load_and_quantize(d, device="cpu")
    d = _copy(nf4, tmp_path / "qs")  # a 4-bit layer whose recorded shape is another (same number of elements)
    import json

    def reshape(sd):
        key = "model.layers.0.mlp.gate_proj.weight.quant_state.bitsandbytes__nf4"
        fields = json.loads(bytes(sd[key].tolist()))
        fields["shape"] = [64, 128]
        sd[key] = torch.tensor(list(json.dumps(fields).encode()), dtype=torch.uint8)
    _edit(d, reshape)
    with pytest.raises(ValueError, match=r"gate_proj: the checkpoint's 4-bit weight has shape \(64, 128\), the model's "
                                         r"layer \(128, 64\)"):
        load_quantized(d, device="cpu")


def test_what_the_model_does_not_have_is_not_loaded(checkpoint, tmp_path):
    """Tensors of layers, biases or 4-bit weights the architecture does not have are reported as unexpected and left
    out (they used to be grafted on: an extra 4-bit submodule, a bias the layer has no place for, an embedding
    replaced by a 4-bit linear)."""
    model, path = checkpoint
    nf4 = str(tmp_path / "nf4")
    save_quantized(load_and_quantize(path, device="cpu"), nf4)
    ids = torch.randint(0, 96, (1, 9))
    ref = logits(load_quantized(nf4, device="cpu"), ids)
    for i, src in enumerate((path, nf4)):
        d = _copy(src, tmp_path / f"bias{i}")
        _edit(d, lambda sd: sd.__setitem__("model.layers.0.self_attn.q_proj.bias", torch.ones(64, dtype=torch.bfloat16)))
        load = load_and_quantize if src == path else load_quantized
        with pytest.warns(UserWarning, match="q_proj.bias"):
            m = load(d, device="cpu")
        assert m.model.layers[0].self_attn.q_proj.bias is None
        assert torch.equal(logits(m, ids), ref)
    d = _copy(nf4, tmp_path / "extra")

    def extra(sd):  # a second copy of q_proj's 4-bit tensors under a name the model does not have
        for k in [k for k in sd if k.startswith("model.layers.0.self_attn.q_proj.weight")]:
            sd[k.replace("q_proj", "extra_proj")] = sd[k].clone()
    _edit(d, extra)
    with pytest.warns(UserWarning, match="extra_proj"):
        m = load_quantized(d, device="cpu")
    assert not hasattr(m.model.layers[0].self_attn, "extra_proj") and torch.equal(logits(m, ids), ref)


def test_the_checkpoint_kind_is_checked(checkpoint, tmp_path):
    _, path = checkpoint
    nf4 = str(tmp_path / "nf4")
    save_quantized(load_and_quantize(path, device="cpu"), nf4)
    with pytest.raises(ValueError, match="already quantized"):
        load_and_quantize(nf4, device="cpu")  # it used to quantize the packed bytes as if they were weights
    with pytest.raises(ValueError, match="not a bitsandbytes 4-bit checkpoint .no quantization_config"):
        load_quantized(path, device="cpu")  # it used to return the 16-bit model
    import json

    d = _copy(nf4, tmp_path / "gptq")
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    with pytest.raises(ValueError, match="quant_method 'gptq'"):
        load_quantized(d, device="cpu")


def test_paths_and_devices_are_checked_before_anything_loads(checkpoint, tmp_path):
    _, path = checkpoint
    with pytest.raises(FileNotFoundError, match="no checkpoint directory"):
        load_quantized(str(tmp_path / "nope"), device="cpu")  # (no look-up on the Hub: 23 s of retries offline)
    with pytest.raises(FileNotFoundError, match="no checkpoint directory"):
        load_and_quantize("nope/model", device="cpu")
    with pytest.raises(NotADirectoryError, match="is a file"):
        load_and_quantize(os.path.join(path, "model.safetensors"), device="cpu")
    with pytest.raises(TypeError, match="path must be a checkpoint directory"):
        load_quantized(None, device="cpu")
    with pytest.raises(TypeError, match="dtype must be one of"):
        load_and_quantize(path, device="cpu", dtype=torch.float64)
    with pytest.raises(TypeError, match="skip must be a str"):
        load_and_quantize(path, device="cpu", skip=None)
    with pytest.raises(ValueError, match="meta device"):
        load_and_quantize(path, device="meta")
    with pytest.raises(TypeError, match="a device must be"):
        load_and_quantize(path, device=None)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU; pass device='cpu'"):
            load_and_quantize(path)  # the default device, cuda
    with pytest.raises(TypeError, match="takes a transformers model"):
        save_quantized(torch.nn.Sequential(Linear4bit.from_linear(torch.nn.Linear(64, 64))), str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")  # refused before anything is written


def test_damaged_files_are_named(checkpoint, tmp_path):
    _, path = checkpoint
    d = _copy(path, tmp_path / "trunc")
    f = os.path.join(d, "model.safetensors")
    data = open(f, "rb").read()
    open(f, "wb").write(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.safetensors is not a readable safetensors file"):
        load_and_quantize(d, device="cpu")
    d = _copy(path, tmp_path / "index")
    open(os.path.join(d, "model.safetensors.index.json"), "w").write("{not json")
    with pytest.raises(ValueError, match=r"model.safetensors.index.json is not valid JSON"):
        load_and_quantize(d, device="cpu")
