"""Training through NF4 layers on the GPU. fastnf4.linear's backward (to x and the bias; the weight is frozen) on
every forward path (decode kernels, GEMM kernels, dequantize + cuBLAS) against a float64 reference, within 2x the
error of the same backward through a dense linear on the dequantized weight; and an unmodified PEFT QLoRA step on a
transformers + bitsandbytes model, patched against unpatched (fastnf4 kernels counted in forward and backward)."""
import pytest
import torch

import fastnf4
from helpers import forward_backward, lm_train_losses, qlora_recipe

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def _rel(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("m", [1, 2, 3, 8, 17, 64, 300, 600])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n, k, nested", [(1024, 2048, True), (1000, 576, False)])
def test_backward_every_path(m, dtype, n, k, nested):
    g = torch.Generator(device="cuda").manual_seed(7 * m + n + k)
    q = fastnf4.quantize((torch.randn(n, k, device="cuda", generator=g) * 0.02).to(dtype), double_quant=nested)
    wd = fastnf4.dequantize(q, dtype)
    x0 = torch.randn(m, k, device="cuda", generator=g).to(dtype)
    b0 = (torch.randn(n, device="cuda", generator=g) * 0.1).to(dtype)
    gy = torch.randn(m, n, device="cuda", generator=g).to(dtype)
    ref_x, ref_b = gy.double() @ wd.double(), gy.double().sum(0)

    xd, bd = x0.clone().requires_grad_(), b0.clone().requires_grad_()
    torch.nn.functional.linear(xd, wd, bd).backward(gy)
    x, b = x0.clone().requires_grad_(), b0.clone().requires_grad_()
    y = fastnf4.linear(x, q, b)
    y.backward(gy)
    torch.cuda.synchronize()
    assert torch.equal(y.detach(), fastnf4.linear(x0, q, b0))  # the op's forward = the plain (cached-launch) call
    assert _rel(x.grad, ref_x) <= 2 * _rel(xd.grad, ref_x), (_rel(x.grad, ref_x), _rel(xd.grad, ref_x))
    assert _rel(b.grad, ref_b) <= 2 * _rel(bd.grad, ref_b) + 1e-6, (_rel(b.grad, ref_b), _rel(bd.grad, ref_b))


@pytest.mark.parametrize("m", [1, 2, 17, 300])
def test_bias_gradient_without_x_gradient(m):
    """Only the bias needs a gradient (x does not): the fused kernels add the bias themselves, so the call must still
    go through the op's autograd (not a plain-eager shortcut), with the bits of the plain call."""
    g = torch.Generator(device="cuda").manual_seed(m)
    q = fastnf4.quantize((torch.randn(1024, 2048, device="cuda", generator=g) * 0.02).to(torch.bfloat16))
    x = torch.randn(m, 2048, device="cuda", generator=g).to(torch.bfloat16)
    b0 = (torch.randn(1024, device="cuda", generator=g) * 0.1).to(torch.bfloat16)
    b = b0.clone().requires_grad_()
    gy = torch.randn(m, 1024, device="cuda", generator=g).to(torch.bfloat16)
    y = fastnf4.linear(x, q, b)
    assert y.requires_grad and torch.equal(y.detach(), fastnf4.linear(x, q, b0))
    y.backward(gy)
    assert _rel(b.grad, gy.double().sum(0)) < 1e-2


@pytest.mark.parametrize("m", [1, 17, 100])
def test_checkpointed_backward_is_bit_equal(m):
    """Activation checkpointing recomputes the forward during backward: with the fused kernels (decode kernel with
    split-K sums, tensor-core GEMMs) the recomputed output and the gradients equal the plain run's bit for bit."""
    from torch.utils.checkpoint import checkpoint

    g = torch.Generator(device="cuda").manual_seed(m)
    q = fastnf4.quantize((torch.randn(8192, 4096, device="cuda", generator=g) * 0.02).to(torch.bfloat16))
    x0 = torch.randn(m, 4096, device="cuda", generator=g).to(torch.bfloat16)
    gy = torch.randn(m, 8192, device="cuda", generator=g).to(torch.bfloat16)
    out = []
    for ckpt in (False, True):
        x = x0.clone().requires_grad_()
        y = checkpoint(fastnf4.linear, x, q, use_reentrant=False) if ckpt else fastnf4.linear(x, q)
        y.backward(gy)
        out.append((y.detach(), x.grad))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


def test_compiled_training_step_gpu():
    """torch.compile (inductor, fullgraph) of a forward + backward through Linear4bit layers on the GPU kernels:
    the eager step's output and gradients (within bf16 rounding: inductor fuses the GELUs its own way)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2048, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 2048),
                                torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda().to(torch.bfloat16)
    fastnf4.quantize_model(model, skip=("0",))
    g = torch.Generator(device="cuda").manual_seed(5)
    for m in (1, 24, 300):
        x = torch.randn(m, 2048, device="cuda", generator=g).to(torch.bfloat16)
        gy = torch.randn(m, 512, device="cuda", generator=g).to(torch.bfloat16)
        eager = forward_backward(model, x, gy)
        compiled = forward_backward(torch.compile(model, fullgraph=True, dynamic=False), x, gy)
        assert len(eager) == 3
        for a, b in zip(eager, compiled):
            assert _rel(b, a.double()) < 1e-2, (m, _rel(b, a.double()))


def test_peft_qlora_step_runs_on_fastnf4(tiny_llama_checkpoint, bnb_load):
    """PEFT LoRA on every linear of a bitsandbytes 4-bit Llama, one training step (loss and backward) unpatched and
    then patched on the same model and adapters: the patched step runs its 4-bit matmuls (forward, gemm_4bit) and its
    weight dequantizations (backward, dequantize_4bit) on fastnf4, with loss and adapter gradients within GEMM
    rounding of bitsandbytes' own step."""
    peft = pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    from fastnf4.integrations import bitsandbytes as integ

    fastnf4.unpatch_bitsandbytes()
    model = bnb_load(tiny_llama_checkpoint)
    torch.manual_seed(1)
    cfg = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, init_lora_weights=False,  # B != 0: A gets gradients
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = peft.get_peft_model(model, cfg)
    ids = torch.randint(0, 1000, (2, 24), device="cuda", generator=torch.Generator(device="cuda").manual_seed(2))

    def step():
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.item(), {n: p.grad.float().clone() for n, p in model.named_parameters() if p.requires_grad}

    loss0, grads0 = step()
    print(f"loss {loss0:.6f}", end=" ")
    fastnf4.patch_bitsandbytes(("cuda",))
    integ.CALLS.clear()
    try:
        loss1, grads1 = step()
        calls = dict(integ.CALLS)
    finally:
        fastnf4.unpatch_bitsandbytes()
    # 2 layers x 7 linears forward; backward dequantizes where the layer's input needs a gradient: not at layer 0's
    # q / k / v, whose input (the frozen embeddings through a frozen norm) needs none
    assert calls.get("gemm_4bit", 0) == 14 and calls.get("dequantize_4bit", 0) == 11, calls
    assert len(grads0) == 28 and grads0.keys() == grads1.keys()  # lora_A and lora_B of 14 linears
    assert abs(loss1 - loss0) / abs(loss0) < 2e-2, (loss0, loss1)
    g0 = torch.cat([g.flatten() for g in grads0.values()])
    g1 = torch.cat([grads1[n].flatten() for n in grads0])
    assert g0.norm() > 0
    rel = ((g1 - g0).norm() / g0.norm()).item()
    print(f"patched {loss1:.6f}, adapter gradients rel {rel:.2e}")
    assert rel < 2e-2, rel


def test_peft_on_fastnf4_layers_matches_bnb_qlora(tiny_llama_checkpoint, bnb_load):
    """The same QLoRA step without bitsandbytes: the checkpoint loaded into fastnf4 Linear4bit layers
    (load_and_quantize), LoRA added through fastnf4.integrations.peft, against PEFT on the bitsandbytes model
    (unpatched) with the same adapters: the same NF4 bytes, loss and adapter gradients within GEMM rounding."""
    peft = pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    from fastnf4.integrations import peft as fpeft
    from fastnf4.integrations.transformers import load_and_quantize

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    fastnf4.unpatch_bitsandbytes()
    torch.manual_seed(1)
    ref = peft.get_peft_model(bnb_load(tiny_llama_checkpoint),
                              peft.LoraConfig(r=8, lora_alpha=16, init_lora_weights=False, target_modules=targets))
    base = load_and_quantize(tiny_llama_checkpoint, device="cuda")
    torch.manual_seed(1)
    own = fpeft.get_peft_model(base, peft.LoraConfig(r=8, lora_alpha=16, init_lora_weights=False,
                                                     target_modules=targets))
    layer = own.base_model.model.model.layers[1].mlp.down_proj
    assert type(layer).__name__ == "LoraLinear4bit"
    ref_layer = ref.base_model.model.model.layers[1].mlp.down_proj
    assert torch.equal(layer.base_layer.weight.view(torch.uint8).flatten(),
                       ref_layer.base_layer.weight.data.view(torch.uint8).flatten())  # the same NF4 bytes
    own_trainable = {n: p for n, p in own.named_parameters() if p.requires_grad}
    ref_trainable = {n: p for n, p in ref.named_parameters() if p.requires_grad}
    assert own_trainable.keys() == ref_trainable.keys() and len(own_trainable) == 28
    for n, p in own_trainable.items():  # the same adapters (same seed, dtype and device)
        assert p.dtype == ref_trainable[n].dtype and p.device == ref_trainable[n].device
        assert torch.equal(p, ref_trainable[n]), n

    ids = torch.randint(0, 1000, (2, 24), device="cuda", generator=torch.Generator(device="cuda").manual_seed(2))
    losses, grads = [], []
    for model in (ref, own):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.float().flatten() for n, p in model.named_parameters() if p.requires_grad})
    g0, g1 = (torch.cat([g[n] for n in sorted(g)]) for g in grads)
    rel = ((g1 - g0).norm() / g0.norm()).item()
    print(f"loss bnb {losses[0]:.6f} fastnf4 {losses[1]:.6f}, adapter gradients rel {rel:.2e}")
    assert abs(losses[1] - losses[0]) / abs(losses[0]) < 2e-2, losses
    assert g0.norm() > 0 and rel < 2e-2, rel


def test_qlora_recipe_on_fastnf4_layers_gpu(tiny_llama_checkpoint):
    """PEFT's QLoRA recipe on a checkpoint loaded into fastnf4 layers (no bitsandbytes): prepare_model_for_kbit_training
    (the rest of the model in float32), bf16 compute on the NF4 layers, gradient checkpointing, all-linear LoRA; a few
    AdamW steps lower the loss."""
    peft = pytest.importorskip("peft")
    from fastnf4.integrations import peft as fpeft
    from fastnf4.integrations.transformers import load_and_quantize

    model = load_and_quantize(tiny_llama_checkpoint, device="cuda", compute_dtype=torch.bfloat16)
    model = qlora_recipe(model, peft, fpeft, r=8)
    ids = torch.randint(0, 1000, (2, 32), device="cuda", generator=torch.Generator(device="cuda").manual_seed(4))
    losses = lm_train_losses(model, ids, lr=1e-3, steps=5)
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses


def test_dequantize_out_in_place_is_seen_by_autograd():
    """The eager CUDA path of dequantize(out=) (a prepared launch, no op dispatch) marks out as changed, as the op's
    dispatch would: a backward that saved its old values raises; an out that requires grad is refused."""
    q = fastnf4.quantize(torch.randn(64, 128, device="cuda", dtype=torch.bfloat16))
    a = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    saved = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    z = (a * saved).sum()
    fastnf4.dequantize(q, out=saved)  # weight-shaped out
    assert torch.equal(saved, fastnf4.dequantize(q))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()
    with pytest.raises(ValueError, match="out requires grad"):
        fastnf4.dequantize(q, out=a * 1.0)
