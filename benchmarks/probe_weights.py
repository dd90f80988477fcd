"""The model weights the matmul probes run on (shared by probe_wgmma_build / _tail / _splits)."""
import torch

import fastnf4
from fastnf4.bench.harness import model_shapes


def model_weights(min_packed_bytes: float = 8e6):
    """Each distinct (N, K) linear weight of the three models whose packed NF4 weight has at least
    ``min_packed_bytes``: yields (model, layer, n, k, w, q), w a fresh random bf16 weight on the GPU (std 0.02, drawn
    when the weight's turn comes, so the caller's own draws in between keep their order) and q its NF4 (blocksize 64,
    double quantization)."""
    seen = set()
    for model, layer, n, k in model_shapes():
        if (n, k) in seen or n * k // 2 < min_packed_bytes:
            continue
        seen.add((n, k))
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
        yield model, layer, n, k, w, fastnf4.quantize(w, blocksize=64, double_quant=True)
