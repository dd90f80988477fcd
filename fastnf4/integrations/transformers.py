"""transformers models with fastnf4 layers, loaded and saved without bitsandbytes.

* :func:`load_quantized` reads a bnb-4bit checkpoint directory (``config.json`` with a bitsandbytes
  ``quantization_config``, safetensors shards) into the transformers model class, with
  :class:`fastnf4.nn.Linear4bit` where the checkpoint holds 4-bit weights.
* :func:`load_and_quantize` reads a bf16/fp16 checkpoint and quantizes each linear weight as it arrives, on the
  target device, so the whole unquantized model is never in GPU memory.
* :func:`save_quantized` writes what transformers + bitsandbytes load unchanged (same keys, same JSON), in
  bitsandbytes' layout also for layers repacked into the fastnf4 layout (:func:`fastnf4.repack_model`).

The model skeleton is built with parameters on the meta device (``accelerate.init_empty_weights``) and filled
tensor by tensor from the safetensors files. Checkpoints are read with safetensors only.

Both loaders put the model on one ``device``, or split it over GPUs with ``device_map``: transformers' / accelerate's
form ``{module name: device}`` (``""`` is the whole model; a module takes the entry of its longest mapped name), or
``"balanced"`` (or ``"auto"``, as transformers users write it): the decoder layers cut into equal runs over the
visible GPUs, the rest of the model on the first.
Each tensor is loaded (and quantized) straight onto its module's device; accelerate's hooks then move the activations
between GPUs, as for a transformers model loaded with a ``device_map``.
"""
from __future__ import annotations

import copy
import glob
import json
import os
import re
import shutil
import stat
import tempfile
import warnings
from typing import Iterable, Iterator

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..api import quantize
from ..format import FLOAT_DTYPES, NF4Weight
from ..nn import DEFAULT_SKIP, Linear4bit, _matches, _tied_linears, check_compute_dtype, check_skip, state_dict_packed_on

_QS_KEY = re.compile(r"^(.*)\.weight\.quant_state\.bitsandbytes__(nf4|fp4)$")
_INDEX = "model.safetensors.index.json"
_MARK = {"writer": "fastnf4"}  # in every file's header and the index's metadata: what a later save may remove


def _hub_blob(root: str, full: str, real: str) -> bool:
    """``full`` is a file of a Hugging Face cache snapshot (``<repo>/snapshots/<revision>/...``), a symlink to that
    repository's ``<repo>/blobs/<hash>``: the layout ``huggingface_hub`` downloads into, which stays inside the repo."""
    parent = os.path.dirname(root)
    if os.path.basename(parent) != "snapshots" or not os.path.islink(full):
        return False
    blobs = os.path.join(os.path.dirname(parent), "blobs")
    return os.path.dirname(real) == blobs


def _checked_file(folder: str, name, what: str) -> str:
    """``folder/name``, where that is a regular file inside ``folder`` (symlinks resolved): a checkpoint is read from
    its own folder only, and a FIFO or device would block or never end. A ValueError naming ``name`` otherwise, a
    FileNotFoundError where there is nothing of that name."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} {name!r} is not a file name")
    if os.path.isabs(name):
        raise ValueError(f"{what} {name!r} is an absolute path, outside the checkpoint folder")
    full = os.path.join(folder, name)
    root, real = os.path.realpath(folder), os.path.realpath(full)
    if os.path.commonpath([root, os.path.normpath(os.path.join(root, name))]) != root:
        raise ValueError(f"{what} {name!r} names a path outside the checkpoint folder")
    if real == root or (os.path.commonpath([root, real]) != root and not _hub_blob(root, full, real)):
        raise ValueError(f"{what} {name!r} resolves outside the checkpoint folder (to {real})")
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {name!r} is not there ({full})") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{what} {name!r} is not a regular file ({full})")
    return full


def _shards(path: str) -> list[str]:
    """The checkpoint's safetensors files: those of ``model.safetensors.index.json``'s weight map, else
    ``model.safetensors``, else every ``*.safetensors`` file (a repository may hold other files too, e.g. Mistral's
    ``consolidated.safetensors`` beside the transformers shards). Each must be a regular file inside ``path``
    (:func:`_checked_file`)."""
    if os.path.lexists(os.path.join(path, _INDEX)):
        index = _checked_file(path, _INDEX, "index")
        with open(index) as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{index} is not valid JSON: {e}") from None
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index} has no weight_map")
        bad = [n for n in weight_map.values() if not isinstance(n, str)]
        if bad:
            raise ValueError(f"{index} names shards that are not file names: {bad[:3]}")
        return [_checked_file(path, name, f"{_INDEX} entry") for name in sorted(set(weight_map.values()))]
    if os.path.lexists(os.path.join(path, "model.safetensors")):
        return [_checked_file(path, "model.safetensors", "shard")]
    files = sorted(os.path.basename(f) for f in glob.glob(os.path.join(glob.escape(path), "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {path} (fastnf4 reads safetensors only)")
    return [_checked_file(path, name, "shard") for name in files]


def _tensors(path: str, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors under the names ``model`` has for them (transformers' key renaming applied)."""
    rename = _key_renamer(model)
    for f in _shards(path):
        try:
            sf = safe_open(f, framework="pt")
        except Exception as e:  # safetensors' own error type: a corrupt or truncated file
            raise ValueError(f"{f} is not a readable safetensors file: {e}") from None
        with sf:
            for key in sf.keys():
                yield rename(key), sf.get_tensor(key)


def _key_renamer(model: torch.nn.Module):
    """transformers' renaming of checkpoint keys for ``model`` (its ``WeightRenaming`` rules, transformers >= 5), as
    ``from_pretrained`` applies them before matching keys to the model: e.g. GPT-NeoX checkpoints (Pythia) hold the
    output layer as ``embed_out.*``, which transformers 5 loads into ``lm_head`` (and writes back as ``embed_out.*``).
    The identity where transformers has no such rules."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming
    except ImportError:
        return lambda key: key
    renamings = [t for t in get_model_conversion_mapping(model) if isinstance(t, WeightRenaming)]

    def rename(key: str) -> str:
        # each rule in turn, as transformers' loader does (the per-rule method is in 5.17, the lent GPU machine's
        # version, and in 5.24; the helper that loops over them only in 5.24)
        for r in renamings:
            key, _ = r.rename_source_key(key)
        return key

    return rename


def _quantization(config) -> dict | None:
    """The checkpoint's ``quantization_config`` as a dict (None where it has none)."""
    qc = getattr(config, "quantization_config", None)
    if qc is None or isinstance(qc, dict):
        return qc
    return qc.to_dict() if hasattr(qc, "to_dict") else vars(qc)


def _is_bnb_4bit(qc: dict) -> bool:
    return qc.get("quant_method") == "bitsandbytes" and bool(qc.get("load_in_4bit", qc.get("_load_in_4bit")))


def _skeleton(path: str, dtype: torch.dtype, want_bnb_4bit: bool):
    """The model of the checkpoint directory ``path`` with its parameters on the meta device. ``want_bnb_4bit``: the
    checkpoint must be a bitsandbytes 4-bit one (load_quantized); else it must not be quantized (load_and_quantize)."""
    import transformers
    from accelerate import init_empty_weights

    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a checkpoint directory (str or os.PathLike), got {type(path).__name__}")
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint directory at {path!r} (fastnf4 reads local directories only)")
    if not os.path.isdir(path):
        raise NotADirectoryError(f"{path!r} is a file; give the checkpoint's directory (config.json + safetensors)")
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be one of {FLOAT_DTYPES}, got {dtype!r}")
    if os.path.lexists(os.path.join(path, "config.json")):  # (a missing one: transformers' own error)
        _checked_file(path, "config.json", "config")
    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    qc = _quantization(config)
    if want_bnb_4bit and (qc is None or not _is_bnb_4bit(qc)):
        what = "no quantization_config" if qc is None else f"quant_method {qc.get('quant_method')!r}" + (
            " in 8 bits" if qc.get("load_in_8bit") or qc.get("_load_in_8bit") else "")
        raise ValueError(f"{path} is not a bitsandbytes 4-bit checkpoint ({what}); load_quantized reads those only "
                         "(load_and_quantize quantizes a 16-bit one)")
    if not want_bnb_4bit and qc is not None:
        raise ValueError(f"{path} is already quantized (quant_method {qc.get('quant_method')!r}); load_and_quantize "
                         "takes a 16-bit checkpoint (load_quantized reads a bitsandbytes 4-bit one)")
    config.quantization_config = None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with init_empty_weights(include_buffers=False):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def _set_module(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _set_tensor(model: torch.nn.Module, key: str, value: torch.Tensor, unexpected: list[str]) -> None:
    """Put a checkpoint tensor in its place; a key the model does not persist (not in its state_dict) goes to
    ``unexpected`` (transformers skips those too, e.g. an older checkpoint's ``rotary_emb.inv_freq``; what the model
    lacks is an error later)."""
    owner, _, attr = key.rpartition(".")
    try:
        mod = model.get_submodule(owner) if owner else model
    except AttributeError:
        unexpected.append(key)
        return
    if attr in mod._parameters:
        place = mod._parameters
    elif attr in mod._buffers and attr not in mod._non_persistent_buffers_set:
        place = mod._buffers  # (a non-persistent one, e.g. rotary inv_freq, is computed by the model: not loaded)
    else:
        unexpected.append(key)
        return
    old = place[attr]
    if old is not None:  # as transformers: a tensor of another shape or kind is an error, not a silent broadcast
        if tuple(value.shape) != tuple(old.shape):
            raise ValueError(f"{key}: the checkpoint's tensor has shape {tuple(value.shape)}, the model's "
                             f"{tuple(old.shape)}")
        if old.is_floating_point() != value.is_floating_point():
            raise TypeError(f"{key}: the checkpoint's tensor is {value.dtype}, the model's {old.dtype}")
    place[attr] = torch.nn.Parameter(value, requires_grad=False) if place is mod._parameters else value


def _warn_unexpected(unexpected: list[str]) -> None:
    if unexpected:
        warnings.warn(f"the checkpoint holds {len(unexpected)} tensors the model has no place for, not loaded: "
                      f"{unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}", stacklevel=3)


def _as_device(d) -> torch.device:
    if isinstance(d, bool) or not isinstance(d, (int, str, torch.device)):
        raise TypeError(f"a device must be a torch.device, a string or a GPU index, got {d!r}")
    d = torch.device("cuda", d) if isinstance(d, int) else torch.device(d)
    if d.type == "meta":
        raise ValueError("the loaders fill the model with the checkpoint's tensors: the meta device has no place for them")
    if d.type == "cuda" and d.index is None:
        _require_gpus(d)
        return torch.device("cuda", torch.cuda.current_device())
    return d


def _require_gpus(d: torch.device) -> None:
    """A ValueError naming ``d`` where this torch has no such CUDA GPU."""
    if not torch.cuda.is_available():
        raise ValueError(f"device {str(d)!r}, but this torch has no CUDA GPU; pass device='cpu'")
    if d.index is not None and d.index >= torch.cuda.device_count():
        raise ValueError(f"device {str(d)!r}, but only {torch.cuda.device_count()} CUDA GPUs are visible")


def _decoder_layers(model: torch.nn.Module) -> str:
    """The name of the model's longest ``nn.ModuleList`` (its decoder layers)."""
    lists = [(len(m), n) for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    if not lists:
        raise ValueError('device_map found no list of layers in the model to balance; give a dict')
    return max(lists)[1]


def _device_plan(model: torch.nn.Module, device, device_map) -> dict[str, torch.device]:
    """``{module name: device}`` with no name inside another, covering the model: where each module's tensors go."""
    if device_map is None:
        return {"": _as_device(device)}
    if isinstance(device_map, str):
        if device_map not in ("balanced", "auto"):
            raise ValueError(f'device_map must be a dict, "balanced" or "auto", got {device_map!r}')
        gpus = torch.cuda.device_count()
        if gpus == 0:
            raise ValueError(f"device_map={device_map!r} needs CUDA GPUs")
        layers = _decoder_layers(model)
        count = len(model.get_submodule(layers))
        wanted = {"": torch.device("cuda", 0)}
        wanted.update({f"{layers}.{i}": torch.device("cuda", i * gpus // count) for i in range(count)})
    elif isinstance(device_map, dict):
        wanted = {name: _as_device(d) for name, d in device_map.items()}
        modules = dict(model.named_modules())
        unknown = sorted(name for name in wanted if name not in modules)
        if unknown:
            raise ValueError(f"device_map names modules the model does not have: {unknown[:5]}")
    else:
        raise TypeError(f"device_map must be a dict or a string, got {type(device_map).__name__}")
    plan: dict[str, torch.device] = {}

    def walk(name: str, module: torch.nn.Module, dev) -> None:
        dev = wanted.get(name, dev)
        prefix = f"{name}." if name else ""
        if not any(k != name and k.startswith(prefix) for k in wanted):  # nothing mapped inside: one device
            if dev is None:
                if next(module.parameters(), None) is None and next(module.buffers(), None) is None:
                    return  # no tensors to place
                raise ValueError(f"device_map gives no device for {name!r} (add it, or \"\" for the rest)")
            plan[name] = dev
            return
        if next(module.parameters(recurse=False), None) is not None or next(module.buffers(recurse=False), None) \
                is not None:
            raise ValueError(f"device_map splits {name!r}, which holds tensors of its own; map it whole")
        for child, sub in module.named_children():
            walk(prefix + child, sub, dev)

    walk("", model, None)
    if len({d.type for d in plan.values()}) > 1:
        raise ValueError("device_map mixes CPU and GPUs; fastnf4 splits a model over GPUs only (no offload)")
    for d in set(plan.values()):
        if d.type == "cuda":
            _require_gpus(d)
    return plan


def _device_of(plan: dict[str, torch.device], module_name: str) -> torch.device:
    """The device ``plan`` gives the module ``module_name`` (or a module inside it)."""
    name = module_name
    while name not in plan:
        if not name:
            raise ValueError(f"no device for {module_name!r}")  # (a plan from _device_plan covers every module)
        name = name.rpartition(".")[0]
    return plan[name]


def _owner(key: str) -> str:
    return key.rpartition(".")[0]


def _finish(model: torch.nn.Module, plan: dict[str, torch.device], missing: list[str]) -> torch.nn.Module:
    # (an output layer held in 4 bits cannot share the embedding's tensor: left as the checkpoint has it)
    if getattr(model.config, "tie_word_embeddings", False) and not isinstance(model.get_output_embeddings(), Linear4bit):
        model.tie_weights()
    left = missing + [n for n, p in model.named_parameters() if p.is_meta]
    if left:
        raise ValueError(f"the checkpoint did not provide {left[:5]}{' ...' if len(left) > 5 else ''}")
    devices = set(plan.values())
    if len(devices) == 1:
        return model.to(devices.pop()).eval()  # buffers created on the CPU by the skeleton
    placed: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):  # tied weights must share a device
        first = placed.setdefault(id(p), name)
        if _device_of(plan, _owner(first)) != _device_of(plan, _owner(name)):
            raise ValueError(f"device_map puts the tied weights {first!r} and {name!r} on different devices")
    for name, b in list(model.named_buffers()):
        owner, _, attr = name.rpartition(".")
        dev = _device_of(plan, owner)
        if b.device != dev:
            model.get_submodule(owner)._buffers[attr] = b.to(dev)
    from accelerate import dispatch_model

    # accelerate's hooks move each mapped module's inputs to its device (its tensors are there already: no copies)
    dispatch_model(model, device_map={name: d.index for name, d in plan.items()},
                   skip_keys=getattr(model, "_skip_keys_device_placement", None))
    return model.eval()


def load_quantized(path: str, device: str | torch.device = "cuda", dtype: torch.dtype = torch.bfloat16,
                   compute_dtype: torch.dtype | None = None, device_map: dict | str | None = None) -> torch.nn.Module:
    """A bnb-4bit checkpoint directory as a transformers model with fastnf4 ``Linear4bit`` layers, on ``device`` or
    split by ``device_map`` (module docstring). As transformers does, a tensor of another shape than the model's is an
    error and one the model has no place for a warning. ``compute_dtype`` None computes in the activations' dtype; the
    checkpoint's ``bnb_4bit_compute_dtype`` is not applied (bitsandbytes' default, float32, would take the slow float32
    paths): pass it to compute exactly as transformers + bitsandbytes would."""
    check_compute_dtype(compute_dtype)
    model = _skeleton(path, dtype, want_bnb_4bit=True)
    plan = _device_plan(model, device, device_map)
    groups: dict[str, dict[str, torch.Tensor]] = {}
    plain: dict[str, torch.Tensor] = {}
    for key, t in _tensors(path, model):
        m = re.match(r"^(.*)\.weight(\..*)?$", key)
        owner = m.group(1) if m else None
        if owner is not None and (key.endswith(".weight") or ".weight." in key):
            groups.setdefault(owner, {})[key] = t
        else:
            plain[key] = t
    four_bit = {p for p, g in groups.items() if any(_QS_KEY.match(k) for k in g)}
    unexpected: list[str] = []
    missing: list[str] = []
    for owner, g in groups.items():
        device = _device_of(plan, owner)
        if owner in four_bit:
            layer = _linear_at(model, owner)
            if layer is None:  # 4-bit tensors of a layer the model does not have (or that is no nn.Linear)
                unexpected.extend(g)
                continue
            try:
                q = NF4Weight.from_state_dict(g, f"{owner}.", device=device)
            except (TypeError, ValueError) as e:
                raise type(e)(f"{owner}: {e}") from None
            if tuple(q.shape) != (layer.out_features, layer.in_features):
                raise ValueError(f"{owner}: the checkpoint's 4-bit weight has shape {tuple(q.shape)}, the model's layer "
                                 f"{(layer.out_features, layer.in_features)}")
            bias = _layer_bias(layer, owner, plain.pop(f"{owner}.bias", None), unexpected, missing)
            _set_module(model, owner, Linear4bit(q, None if bias is None else bias.to(device, dtype), compute_dtype))
        else:
            for key, t in g.items():
                _set_tensor(model, key, t.to(device, dtype if t.is_floating_point() else t.dtype), unexpected)
    for key, t in plain.items():
        _set_tensor(model, key, t.to(_device_of(plan, _owner(key)), dtype if t.is_floating_point() else t.dtype),
                    unexpected)
    _warn_unexpected(unexpected)
    return _finish(model, plan, missing)


def _linear_at(model: torch.nn.Module, name: str) -> torch.nn.Linear | None:
    """The skeleton's ``nn.Linear`` called ``name``, or None where the model has no such linear layer."""
    try:
        m = model.get_submodule(name)
    except AttributeError:
        return None
    return m if isinstance(m, torch.nn.Linear) else None


def _layer_bias(layer: torch.nn.Linear, owner: str, bias: torch.Tensor | None, unexpected: list[str],
                missing: list[str]) -> torch.Tensor | None:
    """The checkpoint's bias for the skeleton's ``layer`` (as transformers: one the layer does not have is unexpected,
    one it has but the checkpoint lacks is missing, one of another shape an error)."""
    if layer.bias is None:
        if bias is not None:
            unexpected.append(f"{owner}.bias")
        return None
    if bias is None:
        missing.append(f"{owner}.bias")
    elif tuple(bias.shape) != (layer.out_features,):
        raise ValueError(f"{owner}.bias: the checkpoint's tensor has shape {tuple(bias.shape)}, the model's "
                         f"{(layer.out_features,)}")
    return bias


def load_and_quantize(path: str, device: str | torch.device = "cuda", dtype: torch.dtype = torch.bfloat16,
                      skip: Iterable[str] = DEFAULT_SKIP, blocksize: int = 64, double_quant: bool = True,
                      quant_type: str = "nf4", compute_dtype: torch.dtype | None = None,
                      device_map: dict | str | None = None) -> torch.nn.Module:
    """A bf16/fp16 checkpoint directory, quantized layer by layer while it loads, each on its device (``device``, or
    the one ``device_map`` gives its module: module docstring)."""
    skip = check_skip(skip)
    check_compute_dtype(compute_dtype)
    model = _skeleton(path, dtype, want_bnb_4bit=False)
    plan = _device_plan(model, device, device_map)
    tied = _tied_linears(model)
    linears = {n: m for n, m in model.named_modules()
               if type(m) is torch.nn.Linear and not _matches(n, skip) and n not in tied}
    biases: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    for key, t in _tensors(path, model):
        owner, _, attr = key.rpartition(".")
        device = _device_of(plan, owner)
        layer = linears.get(owner)  # (the skeleton's layer: its shape and bias stay known after the swap)
        if layer is not None and attr == "weight":
            if tuple(t.shape) != (layer.out_features, layer.in_features) or not t.is_floating_point():
                raise ValueError(f"{key}: the checkpoint's tensor is {t.dtype} of shape {tuple(t.shape)}, the model's "
                                 f"layer takes a float weight of {(layer.out_features, layer.in_features)}")
            w = t.to(device, dtype)
            q = quantize(w, blocksize=blocksize, double_quant=double_quant, quant_type=quant_type)
            del w
            _set_module(model, owner, Linear4bit(q, biases.pop(owner, None), compute_dtype))
        elif layer is not None and attr == "bias":
            bias = _layer_bias(layer, owner, t, unexpected, [])
            if bias is None:
                continue
            new = model.get_submodule(owner)
            if isinstance(new, Linear4bit):
                new.bias = torch.nn.Parameter(bias.to(device, dtype), requires_grad=False)
            else:
                biases[owner] = bias.to(device, dtype)
        else:
            _set_tensor(model, key, t.to(device, dtype if t.is_floating_point() else t.dtype), unexpected)
    _warn_unexpected(unexpected)
    # a layer the checkpoint gave a weight but not the bias it has (a layer without its weight is still on meta)
    missing = [f"{n}.bias" for n, layer in linears.items()
               if layer.bias is not None and isinstance(model.get_submodule(n), Linear4bit)
               and model.get_submodule(n).bias is None]
    return _finish(model, plan, missing)


def save_quantized(model: torch.nn.Module, path: str, max_shard_bytes: int | None = None) -> None:
    """Write ``model`` (with fastnf4 ``Linear4bit`` layers) as a bnb-4bit checkpoint: safetensors plus a
    config.json whose ``quantization_config`` transformers + bitsandbytes understand. With ``max_shard_bytes``, the
    tensors go to shards of at most that size (a tensor larger than it gets a shard of its own) named as transformers
    names them, with a ``model.safetensors.index.json``. The model is not changed.

    Every file is written under a temporary name in ``path`` first and renamed into place once all are written, so a
    save that fails leaves the previous checkpoint as it was. Files fastnf4 did not write are never removed: only the
    shards of a previous fastnf4 save (those its index lists, or its model.safetensors) that this save does not
    rewrite. A model.safetensors or index of another writer that a loader would read instead of the new files stops
    the save before it writes anything."""
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise TypeError(f"save_quantized takes a transformers model (an nn.Module with a .config), got "
                        f"{type(model).__name__}")
    layers = [m for m in model.modules() if isinstance(m, Linear4bit)]
    if not layers:
        raise ValueError("the model has no fastnf4 Linear4bit layers; quantize it first")
    if max_shard_bytes is not None and (isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int)
                                        or max_shard_bytes <= 0):
        raise ValueError(f"max_shard_bytes must be a positive int or None, got {max_shard_bytes!r}")
    settings = {(m.weight_nf4.quant_type, m.weight_nf4.nested) for m in layers}
    if len(settings) > 1:
        raise ValueError(f"the layers mix quant types / double quant {sorted(settings)}: a bnb-4bit config.json holds "
                         "one setting for the whole model")
    os.makedirs(path, exist_ok=True)
    seen: dict[tuple, str] = {}
    out: dict[str, torch.Tensor] = {}
    # layers in the fastnf4 layout give their packed bytes back in the bnb order, converted on the CPU (where they
    # are copied anyway): on the GPU the whole state dict's converted copies would double the packed bytes there
    with state_dict_packed_on("cpu"):
        state = model.state_dict()
    for key, t in state.items():
        ident = (t.device, t.data_ptr(), t.dtype, tuple(t.shape)) if t.numel() else None
        if ident is not None and ident in seen:  # tied weights are stored once, as transformers does
            continue
        if ident is not None:
            seen[ident] = key
        out[key] = t.detach().contiguous().cpu()
    q = layers[0].weight_nf4
    # transformers reads the modules left in 16 bits by name (a name matches itself and names ending in it), so the
    # full names: a leaf name such as "q_proj" would keep every layer of that name out of 4 bits
    unquantized = sorted(n for n, m in model.named_modules() if type(m) is torch.nn.Linear)
    compute = layers[0].compute_dtype or q.dtype
    config = copy.deepcopy(model.config)
    config.quantization_config = {
        "quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
        "bnb_4bit_quant_type": q.quant_type, "bnb_4bit_use_double_quant": q.nested,
        "bnb_4bit_compute_dtype": str(compute).removeprefix("torch."), "bnb_4bit_quant_storage": "uint8",
        # ([] when every linear is in 4 bits: None would make transformers keep its default, lm_head, in 16 bits)
        "llm_int8_skip_modules": unquantized,
    }
    _write_checkpoint(out, config, path, max_shard_bytes)


def _shard_plan(tensors: dict[str, torch.Tensor], max_shard_bytes: int | None) -> dict[str, dict[str, torch.Tensor]]:
    """{file name: its tensors}, in order, named as transformers names them."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if max_shard_bytes is not None and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = t
        size += nbytes
    if len(shards) == 1:
        return {"model.safetensors": shards[0]}
    return {f"model-{i:05d}-of-{len(shards):05d}.safetensors": shard for i, shard in enumerate(shards, 1)}


def _ours(f: str) -> bool:
    """Whether ``f`` is a regular safetensors file whose header carries fastnf4's mark."""
    try:
        if not stat.S_ISREG(os.lstat(f).st_mode):
            return False
        with safe_open(f, framework="pt") as sf:
            return (sf.metadata() or {}).get("writer") == _MARK["writer"]
    except Exception:  # missing or unreadable: not known to be ours
        return False


def _own_index_shards(path: str) -> list[str] | None:
    """The plain file names listed by ``path``'s index where fastnf4 wrote that index, else None."""
    f = os.path.join(path, _INDEX)
    try:
        if not stat.S_ISREG(os.lstat(f).st_mode):
            return None
        with open(f) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    meta = data.get("metadata") if isinstance(data, dict) else None
    if not isinstance(meta, dict) or meta.get("writer") != _MARK["writer"]:
        return None
    names = data.get("weight_map").values() if isinstance(data.get("weight_map"), dict) else ()
    return sorted({n for n in names if isinstance(n, str) and n not in ("", ".", "..") and os.path.basename(n) == n})


def _write_checkpoint(tensors: dict[str, torch.Tensor], config, path: str, max_shard_bytes: int | None) -> None:
    shards = _shard_plan(tensors, max_shard_bytes)
    single = os.path.join(path, "model.safetensors")
    sharded = len(shards) > 1
    # a file of another writer that a loader would read instead of the new ones: refused, not removed
    if sharded and os.path.lexists(single) and not _ours(single):
        raise ValueError(f"{single} was not written by fastnf4 and transformers reads it before a shard index: remove "
                         "it or save to another folder")
    old = _own_index_shards(path)
    if not sharded and old is None and os.path.lexists(os.path.join(path, _INDEX)):
        raise ValueError(f"{os.path.join(path, _INDEX)} was not written by fastnf4 and fastnf4's loaders read it "
                         "before model.safetensors: remove it or save to another folder")
    stale = [n for n in old or () if n not in shards]
    if old is not None and not sharded:
        stale.append(_INDEX)
    if sharded and os.path.lexists(single):
        stale.append("model.safetensors")
    # one hidden folder inside path: the same file system, so each rename is atomic
    tmp = tempfile.mkdtemp(prefix=".fastnf4-save-", dir=path)
    try:
        config.save_pretrained(tmp)
        weight_map, total = {}, 0
        for name, shard in shards.items():
            save_file(shard, os.path.join(tmp, name), metadata={"format": "pt", **_MARK})
            weight_map.update({key: name for key in shard})
            total += sum(t.numel() * t.element_size() for t in shard.values())
        if sharded:
            with open(os.path.join(tmp, _INDEX), "w") as f:
                json.dump({"metadata": {"total_size": total, **_MARK}, "weight_map": weight_map}, f, indent=2)
        # the shards first, then the index, config.json last: a reader sees no index naming a shard not yet there
        def order(name: str) -> int:
            return 0 if name.endswith(".safetensors") else 1 if name == _INDEX else 3 if name == "config.json" else 2

        for name in sorted(os.listdir(tmp), key=order):
            if os.path.isfile(os.path.join(tmp, name)):
                os.replace(os.path.join(tmp, name), os.path.join(path, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for name in stale:  # (checked again: only files carrying fastnf4's mark, or its own index)
        f = os.path.join(path, name)
        if name == _INDEX or _ours(f):
            try:
                os.remove(f)
            except FileNotFoundError:
                pass
