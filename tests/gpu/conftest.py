import pytest
import torch


@pytest.fixture
def bnb_load():
    """Load a checkpoint directory the way transformers users do: BitsAndBytesConfig, NF4, double quant."""
    import transformers

    def load(path):
        cfg = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                              bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
        return transformers.AutoModelForCausalLM.from_pretrained(str(path), quantization_config=cfg,
                                                                 dtype=torch.bfloat16, device_map={"": 0})

    return load


@pytest.fixture
def tiny_llama_checkpoint(tmp_path):
    """A random 2-layer Llama saved in bf16 (safetensors)."""
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=4)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    return tmp_path / "bf16"
