"""PEFT LoRA on fastnf4's own NF4 layers (:class:`fastnf4.nn.Linear4bit`), without bitsandbytes.

Models built on bitsandbytes' ``Linear4bit`` need nothing from here: PEFT wraps those layers itself, and with fastnf4
installed their 4-bit matmuls (forward) and weight dequantizations (backward) already run on fastnf4 (the
bitsandbytes patch). This module is for models whose layers are fastnf4's (``load_quantized``, ``quantize_model``):
PEFT does not know that layer type, so :class:`LoraLinear4bit` is handed to the LoraConfig as a custom LoRA module
(PEFT's ``LoraConfig._register_custom_module``, which PEFT calls experimental; peft >= 0.19)::

    from peft import LoraConfig
    from fastnf4.integrations.peft import get_peft_model
    model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))   # or a list of names

    # an adapter saved from such a model loads back with the config registered the same way:
    config = register(LoraConfig.from_pretrained(path))
    model = PeftModel.from_pretrained(base_model, path, config=config)

The layer computes ``linear(x, W_nf4) + B(A(dropout(x))) * scaling``; gradients reach x and the adapters through
``fastnf4.linear``'s backward (the NF4 weight is frozen). Merging adds ``B @ A * scaling`` to the dequantized weight
and quantizes the sum again with the layer's own settings (blocksize, double quantization, quant type), so, as with
bitsandbytes' 4-bit layers in PEFT, a merged model differs from the unmerged one by one more round of 4-bit rounding.
LoRA variants (DoRA and the others), LoRA biases and initialisations from the base weight (PiSSA, OLoRA,
orthogonal, LoftQ, CorDA, EVA) are refused by PEFT / here with an error naming them.
"""
from __future__ import annotations

import functools
import warnings

import torch

from ..api import dequantize, quantize
from ..nn import Linear4bit

@functools.cache
def _lora_class():
    """The LoRA layer class, built on first use (PEFT is imported only then)."""
    try:
        import peft
        from peft.tuners.lora.layer import LoraLayer
        from peft.tuners.tuners_utils import check_adapters_to_merge
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("fastnf4.integrations.peft needs the peft package (pip install 'peft>=0.19')") from e
    major, minor = (int(p) for p in peft.__version__.split(".")[:2])
    if (major, minor) < (0, 19):  # LoraLayer.update_layer(adapter_name, r, lora_alpha, config) since peft 0.19
        raise ImportError(f"fastnf4.integrations.peft needs peft >= 0.19, found {peft.__version__}")

    class LoraLinear4bit(torch.nn.Module, LoraLayer):
        """LoRA adapters beside a frozen :class:`fastnf4.nn.Linear4bit`."""

        def __init__(self, base_layer: torch.nn.Module, adapter_name: str, config, r: int = 0, lora_alpha: int = 1,
                     **kwargs) -> None:
            if getattr(config, "lora_bias", False):
                raise ValueError("LoraLinear4bit does not support lora_bias=True")
            init = getattr(config, "init_lora_weights", True)
            if isinstance(init, str) and init.lower() != "gaussian":
                # PiSSA / OLoRA / orthogonal / LoftQ / CorDA / EVA read the base layer's weight as a dense matrix;
                # here it is the packed NF4 bytes (without this check they failed with errors naming other things)
                raise ValueError(f"LoraLinear4bit does not support init_lora_weights={init!r} (only True, False and "
                                 "'gaussian': the others start from the base weight as a dense matrix)")
            super().__init__()
            LoraLayer.__init__(self, base_layer)
            self.fan_in_fan_out = False
            self._active_adapter = adapter_name
            self.update_layer(adapter_name, r, lora_alpha=lora_alpha, config=config)

        def _get_in_out_features(self, module):
            return module.in_features, module.out_features

        def _get_base_layer_device_and_dtype(self, base_layer):
            # where PEFT puts new adapters: the NF4 weight's device, the layer's compute dtype (else the weight's)
            q = base_layer.weight_nf4
            return q.device, base_layer.compute_dtype or q.dtype

        def get_delta_weight(self, adapter: str) -> torch.Tensor:
            return (self.lora_B[adapter].weight @ self.lora_A[adapter].weight) * self.scaling[adapter]

        def _requantize(self, sign: float, adapter: str, safe: bool) -> None:
            base = self.get_base_layer()
            q = base.weight_nf4
            w = dequantize(q, dtype=torch.float32) + sign * self.get_delta_weight(adapter).to(q.device, torch.float32)
            if safe and not torch.isfinite(w).all():
                raise ValueError(f"NaNs detected in the merged weights: the adapter {adapter!r} seems to be broken")
            base.weight_nf4 = quantize(w.to(q.dtype), blocksize=q.blocksize, double_quant=q.nested,
                                       quant_type=q.quant_type)

        def merge(self, safe_merge: bool = False, adapter_names: list[str] | None = None) -> None:
            adapter_names = check_adapters_to_merge(self, adapter_names)
            if not adapter_names:
                return
            warnings.warn("merging LoRA into an NF4 layer quantizes the merged weight again: outputs change by one "
                          "more round of 4-bit rounding", UserWarning, stacklevel=2)
            for name in adapter_names:
                if name in self.lora_A:
                    self._requantize(1.0, name, safe_merge)
                    self.merged_adapters.append(name)

        def unmerge(self) -> None:
            if not self.merged:
                warnings.warn("Already unmerged. Nothing to do.", UserWarning, stacklevel=2)
                return
            while self.merged_adapters:
                name = self.merged_adapters.pop()
                if name in self.lora_A:
                    self._requantize(-1.0, name, False)

        def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            self._check_forward_args(x, *args, **kwargs)
            adapter_names = kwargs.pop("adapter_names", None)
            if self.disable_adapters:
                if self.merged:
                    self.unmerge()
                return self.base_layer(x, *args, **kwargs)
            if adapter_names is not None:
                return self._mixed_batch_forward(x, *args, adapter_names=adapter_names, **kwargs)
            result = self.base_layer(x, *args, **kwargs)
            if self.merged:
                return result
            for name in self.active_adapters:
                if name not in self.lora_A:
                    continue
                lora_a, lora_b = self.lora_A[name], self.lora_B[name]
                h = self.lora_dropout[name](self._cast_input_dtype(x, lora_a.weight.dtype))
                result = result + (lora_b(lora_a(h)) * self.scaling[name]).to(result.dtype)
            return result

        def __repr__(self) -> str:
            return "lora." + super().__repr__()

    return LoraLinear4bit


def __getattr__(name: str):
    if name == "LoraLinear4bit":
        return _lora_class()
    raise AttributeError(name)


def register(config):
    """Register :class:`LoraLinear4bit` for :class:`fastnf4.nn.Linear4bit` with a PEFT ``LoraConfig``; returns it."""
    if not hasattr(config, "_register_custom_module"):
        raise TypeError(f"expected a peft LoraConfig (with custom LoRA modules), got {type(config).__name__}")
    config._register_custom_module({Linear4bit: _lora_class()})
    return config


def _all_linear(model: torch.nn.Module) -> set[str]:
    """What PEFT's "all-linear" means, with fastnf4's layers counted as linear: every Linear4bit and nn.Linear by its
    full name, except the output embedding (lm_head) of a model that has one."""
    names = {n for n, m in model.named_modules() if isinstance(m, (Linear4bit, torch.nn.Linear))}
    get_out = getattr(model, "get_output_embeddings", None)
    out = get_out() if callable(get_out) else None
    if out is not None:
        names -= {n for n, m in model.named_modules() if m is out}
    return names


def get_peft_model(model: torch.nn.Module, config, **kwargs):
    """``peft.get_peft_model`` with fastnf4's NF4 layers registered in ``config`` (see :func:`register`).
    ``target_modules="all-linear"`` takes fastnf4's layers too (PEFT's own expansion knows only its layer types and
    would leave every NF4 layer out)."""
    import peft

    target = getattr(config, "target_modules", None)
    if isinstance(target, str) and target.lower() == "all-linear":
        config.target_modules = _all_linear(model)
    return peft.get_peft_model(model, register(config), **kwargs)
