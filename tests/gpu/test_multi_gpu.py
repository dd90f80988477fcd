"""fastnf4 on a GPU that is not the current device (a model split over GPUs: transformers' ``device_map``, whose
hooks move tensors to a layer's GPU but leave cuda:0 current).

Triton and the CUDA runtime launch on the current device, so every fastnf4 entry point makes the tensors' GPU
current for its launches (``_ops.on_device``). The oracle here is the same call with everything on cuda:0: the
kernels are deterministic, so the outputs must be bitwise equal, and they are also checked against a float64
reference (at most 2x the error of cuBLAS on the dequantized weight). Needs two GPUs.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    pytest.skip("needs two CUDA GPUs", allow_module_level=True)

import fastnf4  # noqa: E402
from fastnf4.api import linear_args  # noqa: E402
from fastnf4.codebooks import kernel_code  # noqa: E402
from fastnf4.ops.matmul import dispatch  # noqa: E402
from helpers import rel_err  # noqa: E402

D0, D1 = torch.device("cuda", 0), torch.device("cuda", 1)


@pytest.fixture(autouse=True)
def _current_is_cuda0():
    torch.cuda.set_device(0)
    yield
    assert torch.cuda.current_device() == 0, "a fastnf4 call left another device current"


def _pair(n, k, dtype, nested, seed=0):
    """The same quantized weight on cuda:1 (quantized there) and on cuda:0 (quantized there too)."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.05).to(dtype)
    return (fastnf4.quantize(w.to(D1), double_quant=nested), fastnf4.quantize(w.to(D0), double_quant=nested))


def _same(a, b):
    return torch.equal(a.cpu(), b.cpu())


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_quantize_and_dequantize(nested, dtype):
    q1, q0 = _pair(1000, 768, dtype, nested)
    assert q1.device == D1 and q0.device == D0
    for name in ("packed", "absmax", "nested_absmax", "offset"):
        a, b = getattr(q1, name), getattr(q0, name)
        assert (a is None) == (b is None) and (a is None or _same(a, b)), name
    w1 = fastnf4.dequantize(q1)
    assert w1.device == D1 and _same(w1, fastnf4.dequantize(q0))
    out = torch.full((1000, 768), float("nan"), dtype=torch.float16, device=D1)
    fastnf4.dequantize(q1, dtype=torch.float16, out=out)
    assert _same(out, fastnf4.dequantize(q0, dtype=torch.float16))
    args = (q1.packed_u8, q1.absmax, kernel_code("nf4", D1), q1.blocksize, q1.numel, dtype,
            q1.nested_code, q1.nested_absmax, q1.offset, q1.nested_blocksize)
    assert _same(torch.ops.fastnf4.dequantize_4bit(*args).view(1000, 768), w1)  # through the registered op


# (N, K, M): each fused path of the dispatcher on the H200 and dequantize + cuBLAS (asserted below)
CASES = [(8192, 4096, 1), (8192, 4096, 2), (1024, 4096, 1), (8192, 4096, 3), (8192, 4096, 16), (8192, 4096, 64),
         (8192, 4096, 200), (8192, 4096, 700), (1024, 4096, 8)]


def _paths(cases, dtype):
    with torch.cuda.device(1):
        return {dispatch.pick_path(torch.empty(m, k, dtype=dtype, device=D1), torch.empty(16, dtype=torch.uint8,
                                   device=D1), 64, n, k, True, 256) for n, k, m in cases}


def _check_linear(q1, q0, m, dtype, bias):
    n, k = q1.shape
    x0 = torch.randn(m, k, dtype=dtype, device=D0)
    b0 = torch.randn(n, dtype=dtype, device=D0) if bias else None
    x1, b1 = x0.to(D1), None if b0 is None else b0.to(D1)
    y0 = fastnf4.linear(x0, q0, b0)
    y1 = fastnf4.linear(x1, q1, b1)  # the eager fast path (cached launches)
    assert y1.device == D1 and _same(y1, y0), (n, k, m)
    y1 = torch.ops.fastnf4.linear(x1, *linear_args(q1, b1))  # the registered op: the full path
    assert _same(y1, y0), (n, k, m)
    wd = fastnf4.dequantize(q0, dtype=torch.float32).double()  # the weight as bitsandbytes defines it (float32 products)
    ref = x0.double() @ wd.T + (0 if b0 is None else b0.double())
    dense = torch.nn.functional.linear(x0, wd.to(dtype), b0)
    assert rel_err(y1, ref.to(D1)) <= 2 * rel_err(dense, ref) + 1e-7, (n, k, m)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_every_path(dtype):
    paths = _paths(CASES, dtype)
    assert {"mma", "dequant+matmul"} <= paths, paths
    if torch.cuda.get_device_capability(1) == (9, 0):
        assert "wgmma" in paths, paths
    torch.manual_seed(2)
    weights = {}
    for n, k, m in CASES:
        if (n, k) not in weights:
            weights[n, k] = _pair(n, k, dtype, nested=True, seed=n)
        for bias in (False, True):
            _check_linear(*weights[n, k], m, dtype, bias)


def test_linear_triton_paths(monkeypatch):
    """The Triton GEMV / GEMM (what GPUs without the CUDA kernels run): the dispatcher with the CUDA kernels off."""
    monkeypatch.setattr(dispatch, "mma_wanted", lambda m, n, k: False)
    monkeypatch.setattr(dispatch, "wgmma_wanted", lambda m, n, k, low_bw=False: False)
    monkeypatch.setattr(dispatch.gemv_mma, "pair_wanted", lambda m, n, k, blocksize: False)
    cases = [(8192, 4096, 1), (8192, 4096, 2), (8192, 4096, 8)]
    assert _paths(cases, torch.bfloat16) == {"gemv", "gemm"}
    q1, q0 = _pair(8192, 4096, torch.bfloat16, nested=False, seed=3)
    for _, _, m in cases:
        _check_linear(q1, q0, m, torch.bfloat16, bias=True)


@pytest.mark.parametrize("m", [1, 16, 300])
def test_backward(m):
    q1, q0 = _pair(4096, 2048, torch.bfloat16, nested=True, seed=4)
    x0 = torch.randn(m, 2048, dtype=torch.bfloat16, device=D0)
    b0 = torch.randn(4096, dtype=torch.bfloat16, device=D0)
    g0 = torch.randn(m, 4096, dtype=torch.bfloat16, device=D0)
    grads = []
    for q, dev in ((q0, D0), (q1, D1)):
        # fresh leaves on each device (x0.to(cuda:0) would be x0 itself, and then x0.to(cuda:1) not a leaf)
        x, b = x0.to(dev, copy=True).requires_grad_(), b0.to(dev, copy=True).requires_grad_()
        fastnf4.linear(x, q, b).backward(g0.to(dev))
        grads.append((x.grad, b.grad))
    assert grads[1][0].device == D1
    assert _same(grads[1][0], grads[0][0]) and _same(grads[1][1], grads[0][1])


@pytest.mark.parametrize("m", [1, 16, 128])
def test_graph_capture_on_second_gpu(m):
    q1, q0 = _pair(8192, 4096, torch.bfloat16, nested=True, seed=5)
    x = torch.randn(m, 4096, dtype=torch.bfloat16, device=D1)
    with torch.cuda.device(1):
        fastnf4.linear(x, q1)  # compiled and planned before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = fastnf4.linear(x, q1)
        x.copy_(torch.randn(m, 4096, dtype=torch.bfloat16, device=D1))
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
    assert _same(y, fastnf4.linear(x.to(D0), q0))


def test_first_use_on_second_gpu_in_a_fresh_process():
    """The CUDA kernels' libraries set their launch attributes per device when first used: a process whose first
    fastnf4 calls are on cuda:1 while cuda:0 is current (and then also runs them on cuda:0) must get both right."""
    script = textwrap.dedent("""
        import torch, fastnf4
        torch.cuda.set_device(0)
        w = torch.randn(8192, 4096, dtype=torch.bfloat16) * 0.05
        q1 = fastnf4.quantize(w.to("cuda:1"))
        xs = [torch.randn(m, 4096, dtype=torch.bfloat16) for m in (1, 2, 8, 64, 700)]
        y1 = [fastnf4.linear(x.to("cuda:1"), q1).cpu() for x in xs]
        d1 = fastnf4.dequantize(q1).cpu()
        q0 = fastnf4.quantize(w.to("cuda:0"))
        y0 = [fastnf4.linear(x.to("cuda:0"), q0).cpu() for x in xs]
        torch.cuda.synchronize(0); torch.cuda.synchronize(1)
        assert torch.cuda.current_device() == 0
        assert torch.equal(d1, fastnf4.dequantize(q0).cpu())
        assert all(torch.equal(a, b) for a, b in zip(y1, y0)), [(a - b).abs().max().item() for a, b in zip(y1, y0)]
        print("same")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("same"), run.stderr[-3000:]


def test_transformers_bnb_model_split_over_two_gpus(tiny_llama_checkpoint):
    """An unmodified transformers + bitsandbytes model with its second layer, norm and head on cuda:1 (cuda:0
    current), patched: every 4-bit call runs on fastnf4, prefill and a decode step give bitwise the logits of the
    same model on one GPU."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("bitsandbytes")
    from fastnf4.integrations import bitsandbytes as integ

    cfg = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                          bnb_4bit_compute_dtype=torch.bfloat16)

    def load(device_map):
        return transformers.AutoModelForCausalLM.from_pretrained(
            str(tiny_llama_checkpoint), quantization_config=cfg, dtype=torch.bfloat16, device_map=device_map)

    split = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0, "model.layers.1": 1,
             "model.norm": 1, "lm_head": 1}
    ids = torch.randint(0, 1000, (2, 24), device=D0)
    fastnf4.patch_bitsandbytes(("cuda",))
    try:
        one, two = load({"": 0}), load(split)
        assert two.model.layers[1].mlp.up_proj.weight.device == D1
        assert two.model.layers[0].mlp.up_proj.weight.device == D0
        integ.CALLS.clear()
        with torch.no_grad():
            logits = [(one(x).logits, two(x).logits) for x in (ids, ids[:, :1])]  # M = 48, then M = 2
        calls = dict(integ.CALLS)
    finally:
        fastnf4.unpatch_bitsandbytes()
    assert sum(calls.get(k, 0) for k in ("gemm_4bit", "gemv_4bit")) >= 56, calls  # 14 linears x 2 models x 2 calls
    for a, b in logits:
        assert torch.isfinite(a).all() and _same(a, b)


def test_fastnf4_loaders_split_a_model_over_two_gpus(tiny_llama_checkpoint, tmp_path):
    """fastnf4's own loaders (no bitsandbytes) with ``device_map``: the layers' NF4 weights on their GPUs, logits and a
    greedy generation bitwise those of the model on one GPU."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from fastnf4.integrations.transformers import load_and_quantize, load_quantized, save_quantized

    one = load_and_quantize(str(tiny_llama_checkpoint), device="cuda:0")
    save_quantized(one, str(tmp_path / "nf4"))
    split = [load_and_quantize(str(tiny_llama_checkpoint), device_map="balanced"),
             load_quantized(str(tmp_path / "nf4"), device_map={"": 1, "model.layers.0": 0})]
    for two in split:
        assert two.model.layers[0].mlp.up_proj.weight_nf4.device == D0
        assert two.model.layers[1].mlp.up_proj.weight_nf4.device == D1
    ids = torch.randint(0, 1000, (2, 24), device=D0)
    with torch.no_grad():
        want = one(ids).logits
        tokens = one.generate(ids, max_new_tokens=6, do_sample=False)
        for two in split:
            assert _same(two(ids).logits, want)
            assert _same(two.generate(ids, max_new_tokens=6, do_sample=False), tokens)
