"""A tiny random-init model of our architecture, for fast logic tests (never the only evidence)."""
import torch

from engine.infer.loader import LoadedModel
from engine.infer.model import ModelConfig, Transformer
from engine.quant.precisions import QuantSpec, weight_breakdown


class TinyTokenizer:
    eos_token_id = None
    pad_token_id = 0
    chat_template = None

    def __init__(self, vocab=16):
        self.vocab = vocab

    def __call__(self, s):
        return {"input_ids": [1 + (ord(c) % (self.vocab - 1)) for c in s]}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(ord("a") + (i % 26)) for i in ids)

    def get_vocab(self):
        return {chr(ord("a") + i): i for i in range(self.vocab)}


def tiny_model(seed=0, vocab=16, layers=2, hidden=32, temp=1.0) -> LoadedModel:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=64, num_layers=layers, num_heads=4,
                      num_kv_heads=2, head_dim=hidden // 4, max_position=256, qkv_bias=True)
    m = Transformer(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5 * temp)
        for mod in m.modules():
            if mod.__class__.__name__ == "RMSNorm":
                mod.weight.fill_(1.0)
    m.eval().requires_grad_(False)
    return LoadedModel(name=f"tiny-{seed}", folder=f"/tiny/{seed}", spec=QuantSpec("fp32"), device="cpu", model=m,
                       tokenizer=TinyTokenizer(vocab), load_s=0.0, weights=weight_breakdown(m))
