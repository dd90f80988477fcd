"""``fastnf4 bench e2e`` on CPU, without a GPU: the options (``--e2e-modes``, ``--e2e-variants``) from the command line
to ``bench.e2e.plan``, the NF4 byte floor of a model's 4-bit linears against the bytes of real fastnf4 weights, the
profiler split's kernel classes (fastnf4's, bitsandbytes', inductor's and cuBLAS' kernel names), and the compiled
forward's fall-back from fullgraph=True, with a tiny Qwen3 traced by Dynamo (backend "eager")."""
from __future__ import annotations

import argparse
import functools
import math
from types import SimpleNamespace

import pytest
import torch

from fastnf4.bench import e2e
from fastnf4.study.e2e import kernel_split
from helpers import bench_opts


# ---------------------------------------------------------------------------------------------- options


def parsed_opts(monkeypatch, tmp_path, *args) -> argparse.Namespace:
    """The options ``fastnf4 bench e2e ARGS`` hands the benchmark (``helpers.bench_opts``)."""
    return bench_opts(monkeypatch, tmp_path, "e2e", *args)


def test_default_plan_is_eager_and_graph_every_variant(monkeypatch, tmp_path):
    opts = parsed_opts(monkeypatch, tmp_path)
    p = e2e.plan(opts, bnb_available=True)
    assert p == {"models": ["qwen3-32b"], "layers": None, "batches": [1, 8, 32], "modes": ["eager", "graph"],
                 "variants": ["fastnf4", "bnb", "bnb+fastnf4", "bf16"], "skipped": []}


def test_modes_and_variants_from_the_command_line(monkeypatch, tmp_path):
    opts = parsed_opts(monkeypatch, tmp_path, "--models", "llama-3.3-70b", "--e2e-layers", "4", "--batches", "8", "1",
                       "--e2e-modes", "compiled", "eager", "--e2e-variants", "bf16", "fastnf4")
    p = e2e.plan(opts, bnb_available=True)
    # measured in the fixed order (eager before any profiled replay; fastnf4 first) whatever order they were given in
    assert p["modes"] == ["eager", "compiled"] and p["variants"] == ["fastnf4", "bf16"]
    assert p["models"] == ["llama-3.3-70b"] and p["layers"] == 4 and p["batches"] == [8, 1]


def test_compiled_only(monkeypatch, tmp_path):
    opts = parsed_opts(monkeypatch, tmp_path, "--e2e-modes", "compiled")
    assert e2e.plan(opts, bnb_available=True)["modes"] == ["compiled"]


def test_bitsandbytes_variants_skipped_without_bitsandbytes(monkeypatch, tmp_path):
    opts = parsed_opts(monkeypatch, tmp_path, "--e2e-variants", "bnb+fastnf4", "fastnf4")
    p = e2e.plan(opts, bnb_available=False)
    assert p["variants"] == ["fastnf4"] and p["skipped"] == ["bnb+fastnf4"]
    assert e2e.plan(opts, bnb_available=True)["variants"] == ["fastnf4", "bnb+fastnf4"]


@pytest.mark.parametrize("args", [["--e2e-modes", "fast"], ["--e2e-variants", "int8"], ["--e2e-modes"]])
def test_bad_values_are_refused_by_the_parser(monkeypatch, tmp_path, args, capsys):
    with pytest.raises(SystemExit) as exc:
        parsed_opts(monkeypatch, tmp_path, *args)
    assert exc.value.code == 2


def test_plan_refuses_unknown_values_given_directly():
    with pytest.raises(ValueError, match="mode"):
        e2e.plan(SimpleNamespace(e2e_modes=["graph", "fast"]), bnb_available=True)
    with pytest.raises(ValueError, match="variant"):
        e2e.plan(SimpleNamespace(e2e_variants=["int8"]), bnb_available=True)
    with pytest.raises(ValueError, match="batch"):
        e2e.plan(SimpleNamespace(batches=[0]), bnb_available=True)
    # an options object without the e2e attributes (bench paper's callers) gets the defaults
    assert e2e.plan(SimpleNamespace(), bnb_available=False)["modes"] == ["eager", "graph"]


# ---------------------------------------------------------------------------------------------- the NF4 byte floor


def test_floor_bytes_by_hand():
    # Qwen3-32B o_proj: N = 5120, K = 8192, batch 8; blocks of 64 -> uint8 absmax, a float32 per 256 blocks
    n, k = 5120, 8192
    blocks = n * k // 64
    want = n * k // 2 + blocks + 4 * math.ceil(blocks / 256) + 8 * (n + k) * 2
    assert e2e.nf4_floor_bytes([(n, k)], 8) == want
    assert e2e.nf4_floor_bytes([(n, k)], 8, nested=False) == n * k // 2 + 4 * blocks + 8 * (n + k) * 2
    assert e2e.nf4_floor_bytes([(n, k), (k, n)], 1) == 2 * e2e.nf4_floor_bytes([(n, k)], 1)


def test_floor_bytes_equal_the_bytes_of_a_built_model():
    """The floor's weight bytes are those of the packed weights and statistics of ``study.e2e.build_model``'s
    fastnf4 layers (the code tables and offsets aside), and the activations those of x and y in bf16."""
    transformers = pytest.importorskip("transformers")
    from fastnf4.nn import Linear4bit
    from fastnf4.study.e2e import build_model, fastnf4_linear

    cfg = transformers.AutoConfig.for_model("qwen3", vocab_size=96, hidden_size=128, intermediate_size=256,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            head_dim=32)
    model = build_model(cfg, fastnf4_linear, "cpu")
    shapes = e2e.quantized_shapes(model)
    assert len(shapes) == 14 and (256, 128) in shapes and (128, 256) in shapes  # gate / up and down
    stored = 0
    for m in model.modules():
        if isinstance(m, Linear4bit):
            q = m.weight_nf4
            stored += sum(t.numel() * t.element_size() for t in (q.packed, q.absmax, q.nested_absmax))
    assert e2e.nf4_floor_bytes(shapes, 0) == stored
    acts = sum(3 * (n + k) * 2 for n, k in shapes)
    assert e2e.nf4_floor_bytes(shapes, 3) == stored + acts
    assert e2e.quantized_shapes(build_model(cfg, None, "cpu")) == []  # bf16: no 4-bit linears, no floor


def test_floor_columns_of_a_row():
    shapes = [(5120, 8192)]
    nbytes = e2e.nf4_floor_bytes(shapes, 1)
    row = e2e.add_floor({"batch": 1, "four_bit_us": 20.0}, shapes, copy_gbps=4000.0)
    assert row["floor_4bit_us"] == pytest.approx(nbytes / 4000e9 * 1e6)  # bytes / (4000 GB/s), in us
    assert row["four_bit_vs_floor"] == pytest.approx(20.0 / row["floor_4bit_us"])
    assert "four_bit_vs_floor" not in e2e.add_floor({"batch": 1}, shapes, 4000.0)  # no split: the floor alone
    assert e2e.add_floor({"batch": 1, "four_bit_us": 5.0}, [], 4000.0) == {"batch": 1, "four_bit_us": 5.0}  # bf16
    assert "floor_4bit_us" not in e2e.add_floor({"batch": 1}, shapes, None)  # no bandwidth measured
    assert "floor_4bit_us" not in e2e.add_floor({"note": "does not fit"}, shapes, 4000.0)  # no batch


# ---------------------------------------------------------------------------------------------- kernel split


def fake_profile(kernels: dict[str, float], spans: list | None = None):
    """A profile with ``key_averages`` (per kernel name: total time) and, where ``spans`` (name, start, end) are
    given, ``events`` (one per kernel run, with its interval), as torch.profiler gives them."""
    events = [SimpleNamespace(key=k, count=2, device_time_total=t, device_type="DeviceType.CUDA")
              for k, t in kernels.items()]
    events.append(SimpleNamespace(key="fastnf4::linear", count=2, device_time_total=0.0, device_type="DeviceType.CPU"))
    prof = SimpleNamespace(key_averages=lambda: events)
    if spans is not None:
        runs = [SimpleNamespace(name=k, device_type="DeviceType.CUDA", time_range=SimpleNamespace(start=a, end=b))
                for k, a, b in spans]
        runs.append(SimpleNamespace(name="fastnf4::linear", device_type="DeviceType.CPU",
                                    time_range=SimpleNamespace(start=0.0, end=1e6)))
        prof.events = lambda: runs
    return prof


FOUR_BIT = ["void fastnf4_mma::gemv_mma_pipe<__nv_bfloat16, 1, true, 1, 2, true, false>(fastn",
            "void fastnf4_mma::gemv_split<__nv_bfloat16, true, 1>(fastnf4_mma::Params)",
            "void fastnf4_wg::nf4_wgmma<__nv_bfloat16, 8, true, true, 128>(fastnf4_wg::KParam",
            "void fastnf4_wg::splitk_sum<__nv_bfloat16, 4>(float const*, void const*, void*, ",
            "gemv_kernel", "gemm_kernel", "add_parts_kernel",
            "void gemm_4bit_simt<__nv_bfloat16, 1>(__nv_bfloat16 const*, unsigned char const*",
            "void gemm_4bit_sm80_m16n8k16<__nv_bfloat16, 32, 256, 128>(__nv_bfloat16 const*, ",
            "void kgemm_4bit_inference_naive<__nv_bfloat16, 128, 16>(int, int, int, __nv_bfloat16*"]
DEQUANT = ["void kDequantizeBlockwise<__nv_bfloat16, 512, 64, 8, 2>(float*, unsigned char*, ",
           "dequantize_4bit_kernel"]
REST = ["triton_poi_fused__to_copy_add_embedding_mean_mul_pow_rsqrt_0", "triton_red_fused__to_copy_mean_pow_1",
        "triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_2", "triton_poi_fused_mul_silu_3",
        "triton_poi_fused_cat_index_put_4", "nvjet_sm90_tst_256x8_64x6_4x1_v_bz_TNT",
        "cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_3_64x64x128_4x1x",
        "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<a",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::M"]


def test_kernel_classes_in_eager_and_compiled_steps():
    names = FOUR_BIT + DEQUANT + REST
    times = {k: float(i + 1) for i, k in enumerate(names)}
    split = kernel_split(fake_profile(times), top=3)
    assert split["other_4bit_us"] == sum(times[k] for k in FOUR_BIT)
    assert split["dequant_us"] == sum(times[k] for k in DEQUANT)
    assert split["total_us"] == sum(times.values())  # (the CPU event left out)
    row = e2e.split_row(split, n=4)
    assert row["four_bit_us"] == pytest.approx((split["other_4bit_us"] + split["dequant_us"]) / 4)
    assert row["share_4bit"] == pytest.approx(4 * row["four_bit_us"] / split["total_us"])
    assert row["gpu_us_per_step"] == split["total_us"] / 4 and len(row["top_kernels"]) == 3


def test_busy_time_counts_overlapping_kernels_once():
    # a step as bench e2e saw it at batch 8: the wgmma matmul, its split-K sum launched early (programmatic
    # dependent launch) and waiting on the GPU for it, then an inductor kernel overlapping the sum's tail, a gap,
    # and a bitsandbytes dequantize beside a cuBLAS matmul
    mm, tail = FOUR_BIT[2], FOUR_BIT[3]
    spans = [(mm, 0.0, 10.0), (tail, 2.0, 12.0), (REST[0], 11.0, 15.0), (DEQUANT[0], 20.0, 24.0), (REST[5], 22.0, 30.0)]
    times = {}
    for k, a, b in spans:
        times[k] = times.get(k, 0.0) + (b - a)
    split = kernel_split(fake_profile(times, spans))
    assert split["other_4bit_us"] + split["dequant_us"] == 24.0  # sums: 10 + 10 + 4
    assert split["four_bit_busy_us"] == 16.0  # [0, 12] and [20, 24]
    assert split["busy_us"] == 25.0  # [0, 15] and [20, 30]; the CPU event left out
    row = e2e.split_row(split, n=2)
    assert row["four_bit_us"] == 8.0 and row["four_bit_sum_us"] == 12.0 and row["gpu_us_per_step"] == 12.5
    assert row["share_4bit"] == pytest.approx(16.0 / 25.0)
    # without the kernels' intervals the sums stand
    split = kernel_split(fake_profile(times))
    assert "busy_us" not in split and e2e.split_row(split, n=2)["four_bit_us"] == 12.0


# ---------------------------------------------------------------------------------------------- compiled forward


def test_compiled_forward_falls_back_from_fullgraph_only_for_dynamo_unsupported():
    from torch._dynamo.exc import Unsupported

    calls = []

    def compile_fn(fn, fullgraph, dynamic):
        calls.append((fullgraph, dynamic))

        def run(*a, **k):
            if fullgraph:
                raise Unsupported("graph break in Linear4bit.forward")
            return fn(*a, **k)

        return run

    model = SimpleNamespace(forward=lambda x: x + 1)
    f = e2e.CompiledForward(model, compile_fn)
    assert f(1) == 2 and f(2) == 3
    assert calls == [(True, False), (False, False)] and not f.fullgraph and "Unsupported" in f.fallback

    def failing(fn, fullgraph, dynamic):
        def run(*a, **k):
            raise RuntimeError("inductor failed")

        return run

    g = e2e.CompiledForward(model, failing)
    with pytest.raises(RuntimeError, match="inductor failed"):
        g(1)
    assert g.fullgraph and g.fallback is None


def test_compiled_decode_step_of_a_fastnf4_model_traces_in_one_graph(monkeypatch):
    """The decode step ``decode_speed`` compiles (one token, the cache position in a tensor, a static cache) through
    ``CompiledForward`` on a tiny fastnf4 Qwen3 from ``build_model``: fullgraph holds (no fall-back), and the logits
    equal the eager step's (Dynamo's "eager" backend: the traced graph run as is)."""
    transformers = pytest.importorskip("transformers")
    from fastnf4.study.e2e import build_model, fastnf4_linear

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    torch._dynamo.reset()
    cfg = transformers.AutoConfig.for_model("qwen3", vocab_size=96, hidden_size=64, intermediate_size=128,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            head_dim=16)
    torch.manual_seed(0)
    model = build_model(cfg, fastnf4_linear, "cpu")
    compiled = e2e.CompiledForward(model, functools.partial(torch.compile, backend="eager"))
    ids = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(1))
    out = []
    for call in (model, compiled):
        cache = transformers.StaticCache(config=model.config, max_cache_len=16)
        with torch.inference_mode():
            y = model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(6), use_cache=True).logits
            tok, pos, steps = y[:, -1:].argmax(-1), torch.tensor([6]), []
            for _ in range(3):
                y = call(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits
                steps.append(y)
                tok = y[:, -1:].argmax(-1)
                pos = pos + 1
        out.append(steps)
    assert compiled.fullgraph and compiled.fallback is None
    assert all(torch.equal(a, b) for a, b in zip(*out))
    torch._dynamo.reset()
