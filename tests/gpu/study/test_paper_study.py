"""The paper-study CUDA variants are bit-exact with fastnf4's reference before anyone times them (GPU, nvcc)."""
import shutil

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or shutil.which("nvcc") is None:
    pytest.skip("needs a CUDA GPU and nvcc", allow_module_level=True)

from fastnf4.codebooks import kernel_code  # noqa: E402
from fastnf4.ops.dequantize import naive  # noqa: E402
from fastnf4.study.paper import VARIANTS, Variants, build  # noqa: E402


@pytest.fixture(scope="module")
def study():
    return Variants(build())


@pytest.mark.parametrize("blocksize", [32, 64, 256, 4096])
@pytest.mark.parametrize("numel", [1, 31, 4097, 1_000_003])
def test_variants_bit_exact(study, blocksize, numel):
    g = torch.Generator(device="cuda").manual_seed(numel + blocksize)
    packed = torch.randint(0, 256, ((numel + 1) // 2,), dtype=torch.uint8, device="cuda", generator=g)
    absmax = torch.rand(-(-numel // blocksize), device="cuda", generator=g) * 3
    want = naive.dequantize(packed, absmax, kernel_code("nf4", packed.device), blocksize, numel, torch.bfloat16)
    for v in VARIANTS:
        out = torch.full((numel,), float("nan"), dtype=torch.bfloat16, device="cuda")
        study.dequant(v, packed, absmax, blocksize, out)
        assert torch.equal(out.view(torch.int16), want.view(torch.int16)), (v, blocksize, numel)
