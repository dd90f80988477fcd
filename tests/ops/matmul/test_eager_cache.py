"""CPU-side properties of the eager launch cache (ops/matmul/eager.py); the GPU behaviour is in
tests/gpu/ops/matmul/test_eager_fast_path.py."""
import copy
import pickle

import torch

import fastnf4
from fastnf4.ops.matmul import dispatch, eager, gemv_mma


def _q():
    return fastnf4.quantize(torch.randn(64, 128) * 0.05)


def test_reassigning_a_field_drops_cached_launches():
    q = _q()
    for field, value in (("blocksize", 64), ("absmax", q.absmax.clone()), ("shape", torch.Size((64, 128)))):
        eager._PLANS[q] = {"key": ("addresses", None, object())}
        setattr(q, field, value)
        assert q not in eager._PLANS, field


def test_cached_launches_live_outside_the_weight():
    q = _q()
    eager._PLANS[q] = {"key": ("addresses", None, object())}
    for clone in (copy.copy(q), copy.deepcopy(q), pickle.loads(pickle.dumps(q))):
        assert clone not in eager._PLANS
        assert torch.equal(fastnf4.dequantize(clone), fastnf4.dequantize(q))
    del eager._PLANS[q]


def test_cpu_and_large_m_calls_take_the_full_path():
    q = _q()
    x = torch.randn(3, 128)
    assert eager.try_linear(x, q, None) is None
    assert q not in eager._PLANS
    # above eager.MAX_M no call takes gemv_mma.cu (the key keeps only the wgmma bucket of M there)
    shapes = [(n, k) for n in (1024, 8192, 57344) for k in (4096, 8192, 28672)]
    assert not any(dispatch.mma_wanted(m, n, k) or gemv_mma.pair_wanted(m, n, k, 64)
                   or gemv_mma.burst_wanted(m, n, k, 64) for m in (eager.MAX_M + 1, 64, 512) for n, k in shapes)
