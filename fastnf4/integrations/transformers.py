"""transformers models with fastnf4 layers, loaded and saved without bitsandbytes.

* :func:`load_quantized` reads a bnb-4bit checkpoint directory (``config.json`` with a bitsandbytes
  ``quantization_config``, safetensors shards) into the transformers model class, with
  :class:`fastnf4.nn.Linear4bit` where the checkpoint holds 4-bit weights.
* :func:`load_and_quantize` reads a bf16/fp16 checkpoint and quantizes each linear weight as it arrives, on the
  target device, so the whole unquantized model is never in GPU memory.
* :func:`save_quantized` writes what transformers + bitsandbytes load unchanged (same keys, same JSON).

The model skeleton is built with parameters on the meta device (``accelerate.init_empty_weights``) and filled
tensor by tensor from the safetensors files. Checkpoints are read with safetensors only.
"""
from __future__ import annotations

import glob
import os
import re
from typing import Iterable, Iterator

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..api import quantize
from ..format import NF4Weight
from ..nn import DEFAULT_SKIP, Linear4bit, _matches

_QS_KEY = re.compile(r"^(.*)\.weight\.quant_state\.bitsandbytes__(nf4|fp4)$")


def _shards(path: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {path} (fastnf4 reads safetensors only)")
    return files


def _tensors(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    for f in _shards(path):
        with safe_open(f, framework="pt") as sf:
            for key in sf.keys():
                yield key, sf.get_tensor(key)


def _skeleton(path: str, dtype: torch.dtype):
    import transformers
    from accelerate import init_empty_weights

    config = transformers.AutoConfig.from_pretrained(path)
    config.quantization_config = None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with init_empty_weights(include_buffers=False):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def _set_module(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _set_tensor(model: torch.nn.Module, key: str, value: torch.Tensor) -> None:
    owner, _, attr = key.rpartition(".")
    mod = model.get_submodule(owner) if owner else model
    if attr in mod._parameters:
        mod._parameters[attr] = torch.nn.Parameter(value, requires_grad=False)
    elif attr in mod._buffers:
        mod._buffers[attr] = value
    else:
        raise KeyError(f"the checkpoint has {key!r}, which the model does not")


def _finish(model: torch.nn.Module, device) -> torch.nn.Module:
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    model.to(device)  # buffers created on the CPU by the skeleton
    left = [n for n, p in model.named_parameters() if p.is_meta]
    if left:
        raise ValueError(f"the checkpoint did not provide {left[:5]}{' ...' if len(left) > 5 else ''}")
    return model.eval()


def load_quantized(path: str, device: str | torch.device = "cuda", dtype: torch.dtype = torch.bfloat16,
                   compute_dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A bnb-4bit checkpoint directory as a transformers model with fastnf4 ``Linear4bit`` layers."""
    model = _skeleton(path, dtype)
    groups: dict[str, dict[str, torch.Tensor]] = {}
    plain: dict[str, torch.Tensor] = {}
    for key, t in _tensors(path):
        m = re.match(r"^(.*)\.weight(\..*)?$", key)
        owner = m.group(1) if m else None
        if owner is not None and (key.endswith(".weight") or ".weight." in key):
            groups.setdefault(owner, {})[key] = t
        else:
            plain[key] = t
    four_bit = {p for p, g in groups.items() if any(_QS_KEY.match(k) for k in g)}
    for owner, g in groups.items():
        if owner in four_bit:
            bias = plain.pop(f"{owner}.bias", None)
            q = NF4Weight.from_state_dict(g, f"{owner}.", device=device)
            _set_module(model, owner, Linear4bit(q, None if bias is None else bias.to(device, dtype), compute_dtype))
        else:
            for key, t in g.items():
                _set_tensor(model, key, t.to(device, dtype if t.is_floating_point() else t.dtype))
    for key, t in plain.items():
        _set_tensor(model, key, t.to(device, dtype if t.is_floating_point() else t.dtype))
    return _finish(model, device)


def load_and_quantize(path: str, device: str | torch.device = "cuda", dtype: torch.dtype = torch.bfloat16,
                      skip: Iterable[str] = DEFAULT_SKIP, blocksize: int = 64, double_quant: bool = True,
                      quant_type: str = "nf4", compute_dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A bf16/fp16 checkpoint directory, quantized layer by layer on ``device`` while it loads."""
    model = _skeleton(path, dtype)
    linears = {n for n, m in model.named_modules() if type(m) is torch.nn.Linear and not _matches(n, tuple(skip))}
    biases: dict[str, torch.Tensor] = {}
    for key, t in _tensors(path):
        owner, _, attr = key.rpartition(".")
        if owner in linears and attr == "weight":
            w = t.to(device, dtype)
            q = quantize(w, blocksize=blocksize, double_quant=double_quant, quant_type=quant_type)
            del w
            _set_module(model, owner, Linear4bit(q, biases.pop(owner, None), compute_dtype))
        elif owner in linears and attr == "bias":
            layer = model.get_submodule(owner)
            if isinstance(layer, Linear4bit):
                layer.bias = torch.nn.Parameter(t.to(device, dtype), requires_grad=False)
            else:
                biases[owner] = t.to(device, dtype)
        else:
            _set_tensor(model, key, t.to(device, dtype if t.is_floating_point() else t.dtype))
    return _finish(model, device)


def save_quantized(model: torch.nn.Module, path: str, max_shard_bytes: int | None = None) -> None:
    """Write ``model`` (with fastnf4 ``Linear4bit`` layers) as a bnb-4bit checkpoint: safetensors plus a
    config.json whose ``quantization_config`` transformers + bitsandbytes understand."""
    os.makedirs(path, exist_ok=True)
    sd = model.state_dict()
    seen: dict[tuple, str] = {}
    out: dict[str, torch.Tensor] = {}
    for key, t in sd.items():
        ident = (t.device, t.data_ptr(), t.dtype, tuple(t.shape)) if t.numel() else None
        if ident is not None and ident in seen:  # tied weights are stored once, as transformers does
            continue
        if ident is not None:
            seen[ident] = key
        out[key] = t.detach().contiguous().cpu()
    save_file(out, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    layers = [m for m in model.modules() if isinstance(m, Linear4bit)]
    if not layers:
        raise ValueError("the model has no fastnf4 Linear4bit layers; quantize it first")
    q = layers[0].weight_nf4
    unquantized = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if type(m) is torch.nn.Linear})
    compute = layers[0].compute_dtype or q.dtype
    model.config.quantization_config = {
        "quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
        "bnb_4bit_quant_type": q.quant_type, "bnb_4bit_use_double_quant": q.nested,
        "bnb_4bit_compute_dtype": str(compute).removeprefix("torch."), "bnb_4bit_quant_storage": "uint8",
        "llm_int8_skip_modules": unquantized or None,
    }
    model.config.save_pretrained(path)
