"""Test set-up: without a CUDA GPU the Triton kernels run through Triton's CPU interpreter, so the CPU
suite exercises the real kernel code. TRITON_INTERPRET must be set before any kernel module is imported."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import settings  # noqa: E402

settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=10, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def poisoned(shape, dtype, device="cpu"):
    """An output buffer full of NaN (or 0xAB bytes for integer dtypes), so unwritten elements show."""
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.full(shape, 0xAB, dtype=dtype, device=device)


def bits(t):
    """Bit pattern view, so that NaN == NaN and -0.0 != +0.0 in comparisons."""
    return t.reshape(-1).view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(1234)
