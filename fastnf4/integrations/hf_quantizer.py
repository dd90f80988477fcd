"""fastnf4 behind transformers' own ``from_pretrained`` / ``save_pretrained``, through its quantizer extension point
(``HfQuantizer``, ``register_quantization_config`` / ``register_quantizer``).

Quantize a 16-bit checkpoint while it loads (each linear weight is quantized on its device as its tensor arrives, so
the peak is about the 4-bit model plus one layer)::

    import fastnf4
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map="auto",
                                                 quantization_config=fastnf4.NF4Config())   # blocksize=64, ...
    model.save_pretrained(out)   # a bnb-4bit checkpoint: transformers + bitsandbytes load it as their own

Load a bnb-4bit checkpoint (``quantization_config`` with ``quant_method`` "bitsandbytes", ``load_in_4bit``) into
fastnf4 layers where bitsandbytes is not installed::

    import fastnf4.integrations.hf_quantizer as hfq
    hfq.register()                                   # (importing this module already did it)
    model = AutoModelForCausalLM.from_pretrained(bnb_4bit_path, device_map="cuda")

Routing. transformers keys bnb-4bit checkpoints (and ``BitsAndBytesConfig(load_in_4bit=True)``) to its quantizer
``"bitsandbytes_4bit"``; :func:`register` points that key at :class:`FastNF4Quantizer` only where bitsandbytes cannot
be imported (transformers' own quantizer would refuse to load there), so with bitsandbytes installed the user keeps
transformers' bitsandbytes path (with fastnf4's patch of bitsandbytes where that is on). ``register(bitsandbytes=True)``
is the explicit opt-in that takes those checkpoints over with bitsandbytes installed too; ``register(bitsandbytes=False)``
/ :func:`unregister` give the key back. :class:`NF4Config` has a method of its own, ``"fastnf4"``, registered on import
of this module (``fastnf4.NF4Config`` imports it).

What is quantized: what transformers' bitsandbytes quantizer quantizes. Every ``nn.Linear`` (and GPT-2 style
``Conv1D``, quantized transposed as bitsandbytes does) except the modules transformers keeps in 16 bits (the output
embedding, weights tied to others, the model's last module), its ``_keep_in_fp32_modules`` and the user's
``modules_to_not_convert`` (bitsandbytes' ``llm_int8_skip_modules``: as there, a list given replaces the default one;
tied weights stay dense all the same). A checkpoint saved from such a model lists the layers it left in 16 bits by
full name, so any loader quantizes exactly those it holds in 4 bits.

Compute dtype: NF4Config's ``compute_dtype`` (default: the activations' dtype). A bitsandbytes config or checkpoint
computes in its ``bnb_4bit_compute_dtype`` as transformers' bitsandbytes layers do, float32 where it names none (the
same numerics, and float32's slower matmuls).

``device_map``: as transformers takes it; each weight is quantized on the device its module is mapped to. As with
bitsandbytes, a map that puts some modules on the CPU and others on GPUs is refused (unless a bitsandbytes config sets
``llm_int8_enable_fp32_cpu_offload``, which keeps the CPU modules in 16 bits), and so is disk offload.

A model quantized with :func:`fastnf4.quantize_model` saves the same way once :func:`attach` has given its config the
bnb-4bit ``quantization_config``. Written against transformers 5.x (tested with 5.17 and 5.24).
"""
from __future__ import annotations

import importlib.util
import sys
import warnings

import torch
from transformers.core_model_loading import ConversionOps, WeightConverter
from transformers.quantizers import auto as _auto
from transformers.quantizers.base import HfQuantizer
from transformers.quantizers.quantizers_utils import should_convert_module
from transformers.utils.quantization_config import BitsAndBytesConfig, QuantizationConfigMixin

from ..api import dequantize, quantize
from ..codebooks import BLOCKSIZES, QUANT_TYPES
from ..format import FLOAT_DTYPES, NF4Weight
from ..nn import Linear4bit

METHOD = "fastnf4"
_BNB_KEY = "bitsandbytes_4bit"  # transformers' quantizer key for 4-bit bitsandbytes configs and checkpoints
# the tensors of one 4-bit weight in a bnb-4bit checkpoint, relative to the layer (NF4Weight.state_dict's keys);
# longest first: transformers 5.17 matches a key against them in this order ("weight" would take "weight.absmax")
_SERIALIZED = ("weight.quant_state.bitsandbytes__nf4", "weight.quant_state.bitsandbytes__fp4", "weight.nested_quant_map",
               "weight.nested_absmax", "weight.quant_map", "weight.absmax", "weight")
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _conv1d():
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover - depends on the transformers version
        return ()
    return Conv1D


def _as_dtype(value, what: str) -> torch.dtype | None:
    if value is None or value in FLOAT_DTYPES:
        return value
    if isinstance(value, str) and value.removeprefix("torch.") in _DTYPES:
        return _DTYPES[value.removeprefix("torch.")]
    raise TypeError(f"{what} must be None, a torch dtype or its name, one of {sorted(_DTYPES)}; got {value!r}")


class NF4Config(QuantizationConfigMixin):
    """Quantize a model to NF4 / FP4 with fastnf4 while ``from_pretrained`` loads it.

    ``blocksize``, ``double_quant`` and ``quant_type`` are :func:`fastnf4.quantize`'s. ``compute_dtype`` None computes in
    the activations' dtype (fastnf4's ``Linear4bit``); a dtype computes in that one. ``modules_to_not_convert``: module
    names (a name, a name suffix or a regular expression, as transformers matches them) kept in 16 bits; None keeps
    the ones transformers keeps (the output layer, tied weights), a list replaces those.

    bitsandbytes' names are taken too (``bnb_4bit_quant_type``, ``bnb_4bit_use_double_quant``,
    ``bnb_4bit_compute_dtype``, ``llm_int8_skip_modules``), so a ``BitsAndBytesConfig``'s 4-bit arguments carry over.
    """

    _ALIASES = {"bnb_4bit_quant_type": "quant_type", "bnb_4bit_use_double_quant": "double_quant",
                "bnb_4bit_compute_dtype": "compute_dtype", "llm_int8_skip_modules": "modules_to_not_convert"}

    def __init__(self, blocksize: int = 64, double_quant: bool = True, quant_type: str = "nf4",
                 compute_dtype: torch.dtype | str | None = None, modules_to_not_convert: list[str] | None = None,
                 **kwargs):
        given = {"blocksize": blocksize, "double_quant": double_quant, "quant_type": quant_type,
                 "compute_dtype": compute_dtype, "modules_to_not_convert": modules_to_not_convert}
        defaults = NF4Config.__init__.__defaults__
        method = kwargs.pop("quant_method", METHOD)
        if method != METHOD:
            raise ValueError(f"NF4Config is quant_method {METHOD!r}, got {method!r}")
        for alias, name in self._ALIASES.items():
            if alias in kwargs:
                value = kwargs.pop(alias)
                if given[name] != defaults[list(given).index(name)] and given[name] != value:
                    raise TypeError(f"NF4Config got both {name}={given[name]!r} and {alias}={value!r}")
                given[name] = value
        if kwargs:
            raise TypeError(f"NF4Config got unexpected arguments {sorted(kwargs)} (it takes {sorted(given)} and "
                            f"bitsandbytes' {sorted(self._ALIASES)})")
        self.quant_method = METHOD
        self.blocksize = given["blocksize"]
        self.double_quant = given["double_quant"]
        self.quant_type = given["quant_type"]
        self.compute_dtype = given["compute_dtype"]
        self.modules_to_not_convert = given["modules_to_not_convert"]
        self.post_init()

    def post_init(self) -> None:
        """Check the fields (transformers' name for it); raise a TypeError / ValueError naming the first bad one."""
        if isinstance(self.blocksize, bool) or not isinstance(self.blocksize, int) or self.blocksize not in BLOCKSIZES:
            raise ValueError(f"blocksize must be one of {BLOCKSIZES}, got {self.blocksize!r}")
        if not isinstance(self.double_quant, bool):
            raise TypeError(f"double_quant must be a bool, got {self.double_quant!r}")
        if self.quant_type not in QUANT_TYPES:
            raise ValueError(f"quant_type must be one of {QUANT_TYPES}, got {self.quant_type!r}")
        self.compute_dtype = _as_dtype(self.compute_dtype, "compute_dtype")
        skip = self.modules_to_not_convert
        if isinstance(skip, str):
            skip = self.modules_to_not_convert = [skip]
        if skip is not None and (not isinstance(skip, (list, tuple)) or not all(isinstance(s, str) for s in skip)):
            raise TypeError(f"modules_to_not_convert must be None or a list of module names, got {skip!r}")
        if skip is not None:
            self.modules_to_not_convert = list(skip)

    def to_dict(self) -> dict:
        out = dict(self.__dict__)
        out["compute_dtype"] = None if self.compute_dtype is None else str(self.compute_dtype).removeprefix("torch.")
        out["modules_to_not_convert"] = None if self.modules_to_not_convert is None else list(self.modules_to_not_convert)
        return out


class _PendingLinear(torch.nn.Linear):
    """A linear layer of the skeleton (on the meta device) that becomes a fastnf4 ``Linear4bit`` when its weight
    arrives. ``transposed``: it stands for a GPT-2 style ``Conv1D``, whose weight is stored [in, out]."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype, transposed: bool):
        super().__init__(in_features, out_features, bias=bias, device="meta", dtype=dtype)
        if transposed:  # the checkpoint's shape, so that transformers' loading bookkeeping sees what it holds
            self.weight = torch.nn.Parameter(torch.empty(in_features, out_features, device="meta", dtype=dtype))
        self.transposed = transposed
        self.requires_grad_(False)


def _set_module(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _mark_loaded(new: torch.nn.Module, old: torch.nn.Module, weight: torch.Tensor) -> None:
    """transformers' flags that keep its weight initialization (run after loading, on what it thinks was not loaded)
    off a layer: on the module, on its weight (a parent module's init may reach it, e.g. GPT-2's for c_proj.weight)
    and, where it was loaded already, on its bias."""
    new._is_hf_initialized = True
    weight._is_hf_initialized = True
    if getattr(old, "bias", None) is not None and new.bias is not None:
        new.bias._is_hf_initialized = getattr(old.bias, "_is_hf_initialized", False)


def _first(v):
    return v[0] if isinstance(v, list) else v


class _QuantizeOp(ConversionOps):
    """transformers' per-tensor quantization step: a 16-bit weight of a pending layer is quantized on the device it
    arrived on and its layer swapped for a ``Linear4bit`` (nothing is returned for transformers to set)."""

    def __init__(self, hf_quantizer: "FastNF4Quantizer"):
        self.hf_quantizer = hf_quantizer  # (transformers reads this attribute: such ops get the tensors as stored)

    def convert(self, input_dict, model=None, missing_keys=None, **kwargs):
        out = {}
        for key, value in input_dict.items():
            owner, _, attr = key.rpartition(".")
            layer = model.get_submodule(owner) if owner else model
            if attr == "weight" and isinstance(layer, _PendingLinear):
                self.hf_quantizer._quantize_into(model, owner, layer, _first(value))
                if missing_keys is not None:
                    missing_keys.discard(key)
            else:
                out[key] = value
        return out


class _DeserializeOp(ConversionOps):
    """Reads the tensors of one checkpoint weight (``weight`` and, for a 4-bit one, its statistics): a 4-bit weight
    becomes the layer's ``Linear4bit``; a 16-bit weight is handed back to transformers unchanged."""

    def __init__(self, hf_quantizer: "FastNF4Quantizer"):
        self.hf_quantizer = hf_quantizer

    def convert(self, input_dict, model=None, full_layer_name=None, missing_keys=None, **kwargs):
        tensors = {k: _first(v) for k, v in input_dict.items()}
        owner = full_layer_name.rpartition(".")[0]
        layer = model.get_submodule(owner) if owner else model
        four_bit = any(k.startswith("weight.quant_state.") for k in tensors)
        if not four_bit:
            if isinstance(layer, _PendingLinear):  # a 16-bit weight where a 4-bit one was expected: kept dense
                self.hf_quantizer._dense_into(model, owner, layer, tensors["weight"])
                if missing_keys is not None:
                    missing_keys.discard(full_layer_name)
                return {}
            return input_dict
        if not isinstance(layer, _PendingLinear) and type(layer) is not torch.nn.Linear:
            raise ValueError(f"{owner}: the checkpoint holds a 4-bit weight for a {type(layer).__name__}, which is no "
                             "linear layer")
        try:
            q = NF4Weight.from_state_dict(tensors, "")
        except (KeyError, TypeError, ValueError) as e:
            raise type(e)(f"{owner}: {e}") from None
        self.hf_quantizer._install(model, owner, layer, q)
        if missing_keys is not None:
            missing_keys.discard(full_layer_name)
        return {}


class FastNF4Quantizer(HfQuantizer):
    """transformers' quantizer for :class:`NF4Config` and (where :func:`register` routes them here) bitsandbytes'
    4-bit configs and checkpoints, with fastnf4 ``Linear4bit`` layers."""

    requires_calibration = False

    def __init__(self, quantization_config, **kwargs):
        super().__init__(quantization_config, **kwargs)
        qc = quantization_config
        self.bnb = isinstance(qc, BitsAndBytesConfig)
        if self.bnb:
            if not qc.load_in_4bit:
                raise ValueError("fastnf4 loads bitsandbytes' 4-bit configs only (load_in_4bit)")
            storage = qc.bnb_4bit_quant_storage
            if not self.pre_quantized and storage not in (None, torch.uint8):
                raise ValueError(f"fastnf4 quantizes into uint8 storage; bnb_4bit_quant_storage={storage} is not "
                                 "supported when quantizing on load")
            self.blocksize, self.double_quant = 64, bool(qc.bnb_4bit_use_double_quant)  # (bitsandbytes' blocksize)
            self.quant_type, self.skip = qc.bnb_4bit_quant_type, qc.llm_int8_skip_modules
            if self.quant_type not in QUANT_TYPES:
                raise ValueError(f"bnb_4bit_quant_type must be one of {QUANT_TYPES}, got {self.quant_type!r}")
        elif isinstance(qc, NF4Config):
            self.blocksize, self.double_quant, self.quant_type = qc.blocksize, qc.double_quant, qc.quant_type
            self.skip = qc.modules_to_not_convert
        else:
            raise TypeError(f"FastNF4Quantizer takes an NF4Config or a BitsAndBytesConfig, got {type(qc).__name__}")
        self.compute_dtype: torch.dtype | None = None
        self.modules_to_not_convert: list[str] = []

    # ------------------------------------------------------------------------------------------ checks, placement
    def validate_environment(self, *args, device_map=None, **kwargs):
        if not isinstance(device_map, dict):
            return
        kinds = {_device_kind(d) for d in device_map.values()}
        if "disk" in kinds:
            raise ValueError("fastnf4 does not offload 4-bit layers to disk: give a device_map without 'disk'")
        offload = self.bnb and self.quantization_config.llm_int8_enable_fp32_cpu_offload
        if "cpu" in kinds and len(kinds) > 1 and not offload:
            raise ValueError("the device_map puts some modules on the CPU and others on GPUs: the 4-bit layers must fit "
                             "on the GPUs (as with bitsandbytes; llm_int8_enable_fp32_cpu_offload=True in a "
                             "BitsAndBytesConfig keeps the CPU modules in 16 bits)")

    def update_device_map(self, device_map):
        if device_map is None:  # (bitsandbytes' default: the current GPU, else the CPU)
            device_map = {"": torch.cuda.current_device()} if torch.cuda.is_available() else {"": "cpu"}
        return device_map

    def adjust_max_memory(self, max_memory):
        return {key: val * 0.90 for key, val in max_memory.items()}  # room for one layer's quantization

    def param_needs_quantization(self, model, param_name: str, **kwargs) -> bool:
        owner, _, attr = param_name.rpartition(".")
        try:
            layer = model.get_submodule(owner) if owner else model
        except AttributeError:
            return False
        return attr == "weight" and isinstance(layer, _PendingLinear)

    def param_element_size(self, model, param_name: str, param) -> float:
        return 0.5 if self.param_needs_quantization(model, param_name) else param.element_size()

    # ------------------------------------------------------------------------------------------ the skeleton
    def _process_model_before_weight_loading(self, model, device_map=None, **kwargs):
        skip = self.get_modules_to_not_convert(model, self.skip, getattr(model, "_keep_in_fp32_modules", None))
        # weights tied to another module's stay dense even where a list given replaces transformers' default (which
        # has them): a 4-bit copy would untie them (bitsandbytes' layer then fails in its forward)
        tied = getattr(model, "all_tied_weights_keys", None) or {}
        skip.extend(sorted({k.removesuffix(".weight") for pair in tied.items() for k in pair} - set(skip)))
        if self.bnb and self.quantization_config.llm_int8_enable_fp32_cpu_offload and isinstance(device_map, dict):
            skip.extend(k for k, v in device_map.items() if _device_kind(v) in ("cpu", "disk"))
        self.modules_to_not_convert = skip
        self.compute_dtype = self._compute_dtype()
        conv1d = _conv1d()
        for name, module in list(model.named_modules()):
            is_conv1d = bool(conv1d) and isinstance(module, conv1d)
            if not (type(module) is torch.nn.Linear or is_conv1d) or not should_convert_module(name, skip):
                continue
            if is_conv1d:
                in_features, out_features = module.weight.shape
            else:
                in_features, out_features = module.in_features, module.out_features
            _set_module(model, name, _PendingLinear(in_features, out_features, module.bias is not None,
                                                    module.weight.dtype, is_conv1d))
        return model

    def _compute_dtype(self) -> torch.dtype | None:
        """The ``Linear4bit`` compute dtype: NF4Config's; for a bitsandbytes config its ``bnb_4bit_compute_dtype``
        (float32 where the config names none), which transformers hands to every bitsandbytes ``Linear4bit`` and which
        that layer then always computes in: the numerics of transformers + bitsandbytes, float32 matmuls included."""
        if not self.bnb:
            return self.quantization_config.compute_dtype
        return self.quantization_config.bnb_4bit_compute_dtype

    # ------------------------------------------------------------------------------------------ loading
    def get_quantize_ops(self):
        return _QuantizeOp(self)

    def get_weight_conversions(self):
        if not self.pre_quantized:
            return []
        return [WeightConverter(source_patterns=list(_SERIALIZED), target_patterns="weight",
                                operations=[_DeserializeOp(self)])]

    def _quantize_into(self, model, name: str, layer: _PendingLinear, weight: torch.Tensor) -> None:
        if layer.transposed:
            weight = weight.t()
        shape = (layer.out_features, layer.in_features)
        if tuple(weight.shape) != shape or not weight.is_floating_point():
            raise ValueError(f"{name}.weight: the checkpoint's tensor is {weight.dtype} of shape "
                             f"{tuple(weight.shape)}, the layer takes a float weight of {shape}")
        q = quantize(weight.contiguous(), blocksize=self.blocksize, double_quant=self.double_quant,
                     quant_type=self.quant_type)
        self._install(model, name, layer, q)

    def _install(self, model, name: str, layer: torch.nn.Module, q: NF4Weight) -> None:
        shape = (layer.out_features, layer.in_features)
        if tuple(q.shape) != shape:
            raise ValueError(f"{name}: the checkpoint's 4-bit weight has shape {tuple(q.shape)}, the model's layer "
                             f"{shape}")
        bias = layer.bias.detach() if layer.bias is not None else None  # (still on meta where it arrives later)
        new = Linear4bit(q, bias, self.compute_dtype)
        _mark_loaded(new, layer, q.packed)
        _set_module(model, name, new)

    def _dense_into(self, model, name: str, layer: _PendingLinear, weight: torch.Tensor) -> None:
        if not weight.is_floating_point():
            raise ValueError(f"{name}: the checkpoint holds a {weight.dtype} weight without the statistics of a 4-bit "
                             "one")
        if layer.transposed:
            raise ValueError(f"{name}: the checkpoint holds a 16-bit weight for a Conv1D layer that its "
                             "quantization_config does not keep in 16 bits")
        dense = torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None, device="meta",
                                dtype=weight.dtype)
        dense.weight = torch.nn.Parameter(weight, requires_grad=False)
        if layer.bias is not None:
            dense.bias = layer.bias
        _mark_loaded(dense, layer, dense.weight)
        _set_module(model, name, dense)

    def _process_model_after_weight_loading(self, model, **kwargs):
        # layers whose weight the checkpoint lacked: transformers initialized them (and said so); quantized as they are
        left = [(n, m) for n, m in model.named_modules() if isinstance(m, _PendingLinear)]
        if left:
            warnings.warn(f"{len(left)} layers had no weight in the checkpoint and were quantized as transformers "
                          f"initialized them: {[n for n, _ in left][:5]}", stacklevel=2)
        for name, layer in left:
            if layer.weight.is_meta:
                raise ValueError(f"{name}.weight was neither loaded nor initialized")
            self._quantize_into(model, name, layer, layer.weight.detach())
        # the loader's record of conversions (used to write the checkpoint's names back on save) keeps only the
        # model's own: ours read the 4-bit tensors, which Linear4bit's state dict writes back as they were
        kept = getattr(model, "_weight_conversions", None)
        if kept:
            model._weight_conversions = [c for c in kept if not any(
                isinstance(op, (_DeserializeOp, _QuantizeOp)) for op in getattr(c, "operations", ()))]
        model.is_loaded_in_4bit = True
        if not self.bnb:  # (a bitsandbytes config already is what save_pretrained should write)
            model.config.quantization_config = bnb_config(model)
        return model

    # ------------------------------------------------------------------------------------------ the rest
    def is_serializable(self, *args, **kwargs) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        return True

    @property
    def is_compileable(self) -> bool:
        return True

    def _dequantize(self, model, dtype=None):
        dtype = _as_dtype(dtype, "dtype")
        for name, m in list(model.named_modules()):
            if isinstance(m, Linear4bit):
                w = dequantize(m.weight_nf4, dtype or m.weight_nf4.dtype)
                dense = torch.nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, device=w.device,
                                        dtype=w.dtype)
                with torch.no_grad():
                    dense.weight.copy_(w)
                    if m.bias is not None:
                        dense.bias.copy_(m.bias)
                _set_module(model, name, dense)
        return model


def _device_kind(d) -> str:
    if isinstance(d, torch.device):
        return d.type
    if isinstance(d, int) and not isinstance(d, bool):
        return "accelerator"
    return "disk" if d == "disk" else "cpu" if d == "cpu" else "accelerator"


def bnb_config(model: torch.nn.Module) -> BitsAndBytesConfig:
    """The bnb-4bit ``quantization_config`` that describes ``model``'s fastnf4 layers, as bitsandbytes writes it: its
    quant type and double quantization, the compute dtype (the layers', else their weights' dtype) and, by full name,
    the linear layers left in 16 bits (``[]`` where none is: None would mean transformers' default list)."""
    layers = [m for m in model.modules() if isinstance(m, Linear4bit)]
    if not layers:
        raise ValueError("the model has no fastnf4 Linear4bit layers; quantize it first")
    settings = {(m.weight_nf4.quant_type, m.weight_nf4.nested) for m in layers}
    if len(settings) > 1:
        raise ValueError(f"the layers mix quant types / double quant {sorted(settings)}: a bnb-4bit config.json holds "
                         "one setting for the whole model")
    (quant_type, nested), = settings
    conv1d = _conv1d()
    dense = sorted(n for n, m in model.named_modules()
                   if type(m) is torch.nn.Linear or (bool(conv1d) and isinstance(m, conv1d)))
    q = layers[0].weight_nf4
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant_type, bnb_4bit_use_double_quant=nested,
                              bnb_4bit_compute_dtype=layers[0].compute_dtype or q.dtype,
                              bnb_4bit_quant_storage=torch.uint8, llm_int8_skip_modules=dense)


def attach(model: torch.nn.Module) -> torch.nn.Module:
    """Make a transformers model whose layers :func:`fastnf4.quantize_model` (or anything else) swapped for fastnf4
    ``Linear4bit`` look as ``from_pretrained(..., quantization_config=NF4Config())`` leaves it: its config gets the
    bnb-4bit ``quantization_config`` (so ``save_pretrained`` writes a checkpoint transformers + bitsandbytes load) and
    the model transformers' quantizer attributes. Returns ``model``."""
    if not hasattr(model, "config") or not hasattr(model, "save_pretrained"):
        raise TypeError(f"attach takes a transformers model, got {type(model).__name__}")
    config = bnb_config(model)
    q = next(m for m in model.modules() if isinstance(m, Linear4bit))
    nf4 = NF4Config(blocksize=q.weight_nf4.blocksize, double_quant=q.weight_nf4.nested,
                    quant_type=q.weight_nf4.quant_type, compute_dtype=q.compute_dtype,
                    modules_to_not_convert=config.llm_int8_skip_modules)
    model.config.quantization_config = config
    model.hf_quantizer = FastNF4Quantizer(nf4, pre_quantized=True)
    model.is_quantized = True
    model.quantization_method = METHOD
    model.is_loaded_in_4bit = True
    return model


# ---------------------------------------------------------------------------------------------- registration


def bitsandbytes_importable() -> bool:
    """Whether bitsandbytes can be imported here (None in ``sys.modules`` counts as not: an import would fail)."""
    if "bitsandbytes" in sys.modules:
        return sys.modules["bitsandbytes"] is not None
    try:
        return importlib.util.find_spec("bitsandbytes") is not None
    except (ImportError, ValueError):
        return False


def register(bitsandbytes: bool | None = None) -> bool:
    """Register :class:`NF4Config` (quant_method ``"fastnf4"``) with transformers, and route bnb-4bit checkpoints and
    ``BitsAndBytesConfig(load_in_4bit=True)`` to fastnf4: with ``bitsandbytes`` None where bitsandbytes cannot be
    imported, True always (the explicit opt-in), False never (transformers' own quantizer again). Idempotent. Returns
    whether fastnf4 now loads those checkpoints."""
    if METHOD not in _auto.AUTO_QUANTIZATION_CONFIG_MAPPING:
        _auto.register_quantization_config(METHOD)(NF4Config)
    if METHOD not in _auto.AUTO_QUANTIZER_MAPPING:
        _auto.register_quantizer(METHOD)(FastNF4Quantizer)
    if bitsandbytes is None:
        bitsandbytes = not bitsandbytes_importable()
    from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer

    # (transformers' register_quantizer refuses a taken name: the entry is replaced in its table directly)
    _auto.AUTO_QUANTIZER_MAPPING[_BNB_KEY] = FastNF4Quantizer if bitsandbytes else Bnb4BitHfQuantizer
    return bool(bitsandbytes)


def unregister() -> None:
    """Give bnb-4bit checkpoints back to transformers' own bitsandbytes quantizer (NF4Config stays registered)."""
    register(bitsandbytes=False)


register()
