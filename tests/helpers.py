import torch

from conftest import bits, poisoned  # noqa: F401

FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def random_weight(n, dtype, gen, special=False):
    """Random normal weights; with ``special`` also zeros, NaN, +-Inf, huge and subnormal-scaled blocks."""
    w = torch.randn(n, generator=gen) * 0.05
    if special and n > 300:
        w[:64] = 0
        w[70] = float("nan")
        w[100] = float("inf")
        w[130] = -float("inf")
        w[200:232] = float("nan")
        w[240:272] *= 1e-39
        w[280:296] *= 1e30
    return w.to(dtype)


def random_packed(numel, blocksize, nested, gen):
    """Random packed bytes and statistics for ``numel`` values (fp32 absmax, or uint8 + nested stats)."""
    from fastnf4.codebooks import dynamic_map

    nb = -(-numel // blocksize)
    packed = torch.randint(0, 256, ((numel + 1) // 2,), dtype=torch.uint8, generator=gen)
    if not nested:
        return packed, torch.rand(nb, generator=gen) * 4, None, None, None
    q = torch.randint(0, 256, (nb,), dtype=torch.uint8, generator=gen)
    n2 = -(-nb // 256)
    return packed, q, dynamic_map(), torch.rand(n2, generator=gen) * 2, torch.rand((), generator=gen)
