"""``Linear4bit`` and ``quantize_model``: NF4 linear layers without bitsandbytes.

``Linear4bit`` keeps one :class:`~fastnf4.format.NF4Weight` and computes ``fastnf4.linear``. Its state dict
uses exactly the keys and tensors of bitsandbytes' ``Linear4bit`` (``weight``, ``weight.absmax``, ...,
``bias``), so a model saved from fastnf4 loads in transformers + bitsandbytes and the reverse; a layer whose weight
is in the fastnf4 layout (``Linear4bit.repack``, :func:`repack_model`) writes the bnb layout there too.
"""
from __future__ import annotations

import contextlib
import contextvars
import re
from collections import abc
from typing import Callable, Iterable, NamedTuple

import torch

from .api import linear, quantize
from .format import FLOAT_DTYPES, MissingKeyError, NF4Weight
from .layouts import check_layout_name, repack, unfit_reason
from .ops.matmul.eager import try_linear


# Where a state dict converts a fastnf4-layout weight's packed bytes back to the bnb order (None: on the weight's
# device). The savers set the CPU (``state_dict_packed_on``): a model's state dict holds every layer's converted copy
# at once, which on the GPU would double the packed bytes there.
_STATE_DICT_PACKED_DEVICE: contextvars.ContextVar = contextvars.ContextVar("packed_device", default=None)


@contextlib.contextmanager
def state_dict_packed_on(device: torch.device | str | None):
    """Inside this context, the state dicts of :class:`Linear4bit` layers in the fastnf4 layout hold their packed bytes
    (converted to the bnb order) on ``device``."""
    token = _STATE_DICT_PACKED_DEVICE.set(device)
    try:
        yield
    finally:
        _STATE_DICT_PACKED_DEVICE.reset(token)


class Linear4bit(torch.nn.Module):
    """``y = x @ dequant(W).T + b`` with W stored as NF4 (bitsandbytes layout, or the fastnf4 layout after
    :meth:`repack`)."""

    def __init__(self, weight: NF4Weight, bias: torch.Tensor | None = None, compute_dtype: torch.dtype | None = None):
        super().__init__()
        if not isinstance(weight, NF4Weight):
            raise TypeError(f"Linear4bit takes an NF4Weight (fastnf4.quantize, NF4Weight.from_bnb / from_state_dict), "
                            f"got {type(weight).__name__}; Linear4bit.from_linear quantizes an nn.Linear")
        if bias is not None and not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
        if len(weight.shape) != 2:
            raise ValueError(f"Linear4bit needs a 2-D weight, got shape {tuple(weight.shape)}")
        if bias is not None and tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"bias must have shape ({weight.shape[0]},) for a weight of shape {tuple(weight.shape)}, "
                             f"got {tuple(bias.shape)}")
        check_compute_dtype(compute_dtype)
        self.weight_nf4 = weight
        self.out_features, self.in_features = weight.shape
        self.bias = torch.nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.compute_dtype = compute_dtype

    @classmethod
    def from_linear(cls, layer: torch.nn.Linear, blocksize: int = 64, double_quant: bool = True,
                    quant_type: str = "nf4", compute_dtype: torch.dtype | None = None) -> "Linear4bit":
        """Quantize ``layer.weight`` where it lies (quantize on the GPU by moving the layer there first)."""
        w = layer.weight.detach()
        q = quantize(w.contiguous(), blocksize=blocksize, double_quant=double_quant, quant_type=quant_type)
        bias = layer.bias.detach() if layer.bias is not None else None
        return cls(q, bias, compute_dtype)

    @property
    def layout(self) -> str:
        """The layout of the weight's packed bytes (``weight_nf4.layout``: one of ``fastnf4.LAYOUTS``)."""
        return self.weight_nf4.layout

    def repack(self, layout: str = "fastnf4") -> "Linear4bit":
        """Put this layer's weight in ``layout`` (one of ``fastnf4.LAYOUTS``): the weight is replaced, and the old packed
        tensor is freed unless something else holds it (for one layer, both exist while converting). A ValueError,
        and nothing changed, for a shape that cannot take the layout (``fastnf4.layouts.unfit_reason``). Returns
        ``self``."""
        self.weight_nf4 = repack(self.weight_nf4, layout)
        return self

    @property
    def weight(self) -> torch.Tensor:
        """The packed NF4 bytes (uint8, read-only), as bitsandbytes' ``Linear4bit.weight`` holds them: code that
        looks up a layer's device through ``.weight`` (PEFT does) finds it here. The weight itself is ``weight_nf4``."""
        return self.weight_nf4.packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # computes in compute_dtype (default: autocast's dtype inside torch.autocast, else x's) and returns x's dtype,
        # as bitsandbytes' Linear4bit does (a model whose other parameters were upcast to float32, as PEFT's QLoRA
        # preparation does, keeps float32 activations)
        in_dtype = x.dtype
        dtype = self.compute_dtype
        if dtype is None:
            kind = "cuda" if x.is_cuda else x.device.type  # (is_cuda: a quarter of .device's host cost)
            # (the meta device has no autocast: torch raises on the query)
            dtype = torch.get_autocast_dtype(kind) if not x.is_meta and torch.is_autocast_enabled(kind) else in_dtype
        bias = self.bias.to(dtype) if self.bias is not None and self.bias.dtype != dtype else self.bias
        if in_dtype != dtype:
            x = x.to(dtype)
        y = try_linear(x, self.weight_nf4, bias)  # eager decode/prefill: the launch prepared for this layer
        if y is None:
            y = linear(x, self.weight_nf4, bias)
        return y if y.dtype == in_dtype else y.to(in_dtype)

    def extra_repr(self) -> str:
        q = self.weight_nf4
        layout = "" if q.layout == "bnb" else f", layout={q.layout}"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"quant_type={q.quant_type}, blocksize={q.blocksize}, double_quant={q.nested}{layout}")

    def _apply(self, fn, recurse=True):  # moves the NF4 tensors with .to()/.cuda() (dtype casts do not apply)
        super()._apply(fn, recurse)
        device = fn(torch.empty(0)).device
        if self.weight_nf4.device != device:
            self.weight_nf4 = self.weight_nf4.to(device)
        return self

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        # always the bnb layout (NF4Weight.state_dict converts a fastnf4-layout weight's packed bytes back)
        destination.update(self.weight_nf4.state_dict(prefix, _STATE_DICT_PACKED_DEVICE.get()))
        if self.bias is not None:
            destination[f"{prefix}bias"] = self.bias if keep_vars else self.bias.detach()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # as nn.Linear's: a missing tensor is a missing key, a bias the layer does not have an unexpected one, a weight
        # or bias of another shape a size mismatch (nothing of this layer is changed then)
        key = f"{prefix}weight"
        if key not in state_dict:
            missing_keys.append(key)
            return
        try:
            q = NF4Weight.from_state_dict(state_dict, prefix, device=self.weight_nf4.device)
        except MissingKeyError as e:  # a statistics tensor of this weight
            missing_keys.append(e.key)
            return
        except (ValueError, TypeError) as e:
            error_msgs.append(f"While loading {key}: {e}")
            return
        if tuple(q.shape) != (self.out_features, self.in_features):
            error_msgs.append(f"size mismatch for {key}: copying a param with shape {tuple(q.shape)} from checkpoint, "
                              f"the shape in current model is {(self.out_features, self.in_features)}.")
            return
        bias_key = f"{prefix}bias"
        bias = state_dict.get(bias_key) if self.bias is not None else None
        if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (self.out_features,)):
            error_msgs.append(f"size mismatch for {bias_key}: copying a param with shape "
                              f"{tuple(getattr(bias, 'shape', ()))} from checkpoint, the shape in current model is "
                              f"{(self.out_features,)}.")
            return
        own = set(q.state_dict(prefix)) | ({bias_key} if self.bias is not None else set())
        # the layer keeps its layout: the checkpoint's bnb bytes are repacked (its shape fits: it is the layer's)
        self.weight_nf4 = repack(q, self.weight_nf4.layout)
        del q
        if self.bias is not None:
            if bias is not None:
                self.bias.data = bias.to(device=self.bias.device, dtype=self.bias.dtype)
            else:
                missing_keys.append(bias_key)
        unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and k not in own)


def check_skip(skip) -> tuple[str, ...]:
    """``skip`` (quantize_model, load_and_quantize) as a tuple of patterns; a TypeError / ValueError naming what is wrong
    with it otherwise."""
    if isinstance(skip, str):
        skip = (skip,)
    elif not isinstance(skip, abc.Iterable):
        raise TypeError(f"skip must be a str or an iterable of str (pass () to quantize every layer), got {skip!r}")
    skip = tuple(skip)
    for p in skip:
        if not isinstance(p, str):
            raise TypeError(f"skip must hold str patterns, got {p!r}")
        try:
            re.compile(p)
        except re.error as e:
            raise ValueError(f"skip pattern {p!r} is not a valid regular expression: {e}") from None
    return skip


def check_compute_dtype(compute_dtype) -> None:
    if compute_dtype is not None and compute_dtype not in FLOAT_DTYPES:
        raise TypeError(f"compute_dtype must be None or one of {FLOAT_DTYPES}, got {compute_dtype!r}")


def _matches(name: str, patterns: str | Iterable[str]) -> bool:
    """Whether ``name`` matches one of ``patterns`` (a module name, a name suffix or a regular expression; a single
    string is one pattern, not its letters)."""
    if isinstance(patterns, str):
        patterns = (patterns,)
    return any(name == p or name.endswith("." + p) or re.fullmatch(p, name) for p in patterns)


DEFAULT_SKIP = ("lm_head",)


def _tied_linears(model: torch.nn.Module) -> set[str]:
    """Names of the ``nn.Linear`` layers whose weight is also another module's (an output layer tied to the input
    embedding): transformers leaves those unquantized, since a 4-bit copy would untie them."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    shared = {n.rpartition(".")[0] for group in names.values() if len(group) > 1 for n in group}
    return {n for n, m in model.named_modules() if n in shared and type(m) is torch.nn.Linear}


def quantize_model(model: torch.nn.Module, skip: Iterable[str] = DEFAULT_SKIP, blocksize: int = 64,
                   double_quant: bool = True, quant_type: str = "nf4", compute_dtype: torch.dtype | None = None,
                   filter_fn: Callable[[str, torch.nn.Linear], bool] | None = None) -> torch.nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (in place) by a :class:`Linear4bit`, except those whose
    name matches ``skip`` (a module name, a name suffix or a regular expression; transformers keeps
    ``lm_head`` unquantized) or that ``filter_fn(name, module)`` rejects, and those whose weight is tied to another
    module's (as transformers does). Each layer is quantized on its own device, one at a time. Returns ``model``."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"quantize_model takes a torch.nn.Module, got {type(model).__name__}")
    skip = check_skip(skip)
    check_compute_dtype(compute_dtype)
    tied = _tied_linears(model)
    chosen = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is not torch.nn.Linear or _matches(full, skip) or full in tied:
                continue
            if filter_fn is not None and not filter_fn(full, child):
                continue
            chosen.append((module, child_name, full))
    # what would make quantize fail is checked on every chosen layer before the first one is replaced, so a bad
    # argument or layer leaves the model as it was; each layer is then quantized and swapped in turn (peak memory:
    # one layer's quantized copy beside the model)
    for module, child_name, full in chosen:
        child = getattr(module, child_name)
        if child.weight.dtype not in FLOAT_DTYPES:
            raise TypeError(f"layer {full}: quantize takes {FLOAT_DTYPES} weights, got {child.weight.dtype}")
    for module, child_name, full in chosen:
        child = getattr(module, child_name)
        try:
            new = Linear4bit.from_linear(child, blocksize, double_quant, quant_type, compute_dtype)
        except (TypeError, ValueError) as e:
            raise type(e)(f"layer {full}: {e}") from None
        setattr(module, child_name, new)
        del child
    return model


class RepackCounts(NamedTuple):
    """What :func:`repack_model` did: layers converted, layers already in the layout, and the names of the layers
    left as they were because their shape cannot take it."""

    repacked: int
    unchanged: int
    skipped: tuple[str, ...]


def repack_model(model: torch.nn.Module, layout: str = "fastnf4") -> RepackCounts:
    """Put the weight of every :class:`Linear4bit` of ``model`` in ``layout`` (one of ``fastnf4.LAYOUTS``), in place,
    one layer at a time (``Linear4bit.repack``: each layer's old packed tensor is freed before the next is converted,
    so the peak is one layer's packed bytes beside the model). A layer whose shape cannot take the layout (the fastnf4
    layout needs N % 16 == 0 and K % 64 == 0) is left as it is and counted in ``skipped``; that never fails. The
    bitsandbytes patch's layers (bitsandbytes' own ``Linear4bit``) are not fastnf4 layers and are never touched.
    Returns the counts."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"repack_model takes a torch.nn.Module, got {type(model).__name__}")
    check_layout_name(layout)
    repacked, unchanged, skipped = 0, 0, []
    for name, module in model.named_modules():
        if not isinstance(module, Linear4bit):
            continue
        if module.weight_nf4.layout == layout:
            unchanged += 1
        elif unfit_reason(module.weight_nf4.shape, layout) is not None:
            skipped.append(name)
        else:
            module.repack(layout)
            repacked += 1
    return RepackCounts(repacked, unchanged, tuple(skipped))
