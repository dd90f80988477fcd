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


def _bnb_load(path):
    cfg = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                          bnb_4bit_compute_dtype=torch.bfloat16)
    return transformers.AutoModelForCausalLM.from_pretrained(path, quantization_config=cfg, dtype=torch.bfloat16,
                                                             device_map={"": 0})


def test_round_trip_both_ways(tmp_path):
    fastnf4.unpatch_bitsandbytes()
    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=4)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    ids = torch.randint(0, 1000, (2, 24), device="cuda")

    # bitsandbytes quantizes and saves; fastnf4 loads it without bitsandbytes' code paths
    theirs = _bnb_load(str(tmp_path / "bf16"))
    theirs.save_pretrained(tmp_path / "bnb-nf4")
    ours = load_quantized(str(tmp_path / "bnb-nf4"), device="cuda")
    w_theirs = theirs.model.layers[1].mlp.down_proj.weight
    w_ours = ours.model.layers[1].mlp.down_proj
    assert isinstance(w_ours, Linear4bit) and torch.equal(w_ours.weight_nf4.packed_u8, w_theirs.data.reshape(-1))
    with torch.no_grad():
        l_theirs, l_ours = theirs(ids).logits.float(), ours(ids).logits.float()
    assert ((l_ours - l_theirs).norm() / l_theirs.norm()).item() < 2e-2

    # fastnf4 quantizes (layer by layer on the GPU) and saves; transformers + bitsandbytes loads it unchanged
    mine = load_and_quantize(str(tmp_path / "bf16"), device="cuda")
    save_quantized(mine, str(tmp_path / "fastnf4-nf4"))
    back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "fastnf4-nf4"), device_map={"": 0})
    assert torch.equal(back.model.layers[0].self_attn.q_proj.weight.data.reshape(-1),
                       mine.model.layers[0].self_attn.q_proj.weight_nf4.packed_u8)
    # and the weights fastnf4 quantized are the ones bitsandbytes quantized from the same checkpoint
    assert torch.equal(mine.model.layers[1].mlp.down_proj.weight_nf4.packed_u8, w_theirs.data.reshape(-1))
    with torch.no_grad():
        l_back, l_mine = back(ids).logits.float(), mine(ids).logits.float()
    assert ((l_back - l_mine).norm() / l_mine.norm()).item() < 2e-2
