"""bnb-4bit checkpoints round-trip between fastnf4 and transformers + bitsandbytes (GPU)."""
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
transformers = pytest.importorskip("transformers")
pytest.importorskip("bitsandbytes")

import fastnf4  # noqa: E402
from fastnf4.integrations.transformers import load_and_quantize, load_quantized, save_quantized  # noqa: E402
from fastnf4.nn import Linear4bit  # noqa: E402


def test_round_trip_both_ways(tiny_llama_checkpoint, bnb_load, tmp_path):
    fastnf4.unpatch_bitsandbytes()
    ids = torch.randint(0, 1000, (2, 24), device="cuda")

    # bitsandbytes quantizes and saves; fastnf4 loads it without bitsandbytes' code paths
    theirs = bnb_load(tiny_llama_checkpoint)
    theirs.save_pretrained(tmp_path / "bnb-nf4")
    ours = load_quantized(str(tmp_path / "bnb-nf4"), device="cuda")
    w_theirs = theirs.model.layers[1].mlp.down_proj.weight
    w_ours = ours.model.layers[1].mlp.down_proj
    assert isinstance(w_ours, Linear4bit) and torch.equal(w_ours.weight_nf4.packed_u8, w_theirs.data.reshape(-1))
    with torch.no_grad():
        l_theirs, l_ours = theirs(ids).logits.float(), ours(ids).logits.float()
    assert ((l_ours - l_theirs).norm() / l_theirs.norm()).item() < 2e-2

    # fastnf4 quantizes (layer by layer on the GPU) and saves; transformers + bitsandbytes loads it unchanged
    mine = load_and_quantize(str(tiny_llama_checkpoint), device="cuda")
    save_quantized(mine, str(tmp_path / "fastnf4-nf4"))
    back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "fastnf4-nf4"), device_map={"": 0})
    assert torch.equal(back.model.layers[0].self_attn.q_proj.weight.data.reshape(-1),
                       mine.model.layers[0].self_attn.q_proj.weight_nf4.packed_u8)
    # and the weights fastnf4 quantized are the ones bitsandbytes quantized from the same checkpoint
    assert torch.equal(mine.model.layers[1].mlp.down_proj.weight_nf4.packed_u8, w_theirs.data.reshape(-1))
    with torch.no_grad():
        l_back, l_mine = back(ids).logits.float(), mine(ids).logits.float()
    assert ((l_back - l_mine).norm() / l_mine.norm()).item() < 2e-2


def test_device_map_on_one_gpu(tiny_llama_checkpoint):
    """device_map "auto" / "balanced" / a dict of GPU 0 on a one-GPU machine: the whole model on cuda:0, logits bit
    for bit those of device="cuda:0" (a two-GPU split: tests/gpu/test_multi_gpu.py)."""
    if torch.cuda.device_count() != 1:
        pytest.skip("the one-GPU case")
    ids = torch.randint(0, 1000, (2, 24), device="cuda")
    plain = load_and_quantize(str(tiny_llama_checkpoint), device="cuda:0")
    with torch.no_grad():
        want = plain(ids).logits
        for device_map in ("auto", "balanced", {"": 0, "model.layers.1": "cuda:0"}):
            model = load_and_quantize(str(tiny_llama_checkpoint), device_map=device_map)
            assert {p.device for p in model.parameters()} == {torch.device("cuda", 0)}
            assert model.model.layers[1].mlp.up_proj.weight_nf4.device == torch.device("cuda", 0)
            assert torch.equal(model(ids).logits, want), device_map
