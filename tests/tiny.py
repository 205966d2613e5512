"""A tiny random-init model of our architecture, for fast logic tests (never the only evidence).

`register()` (called by conftest.py) offers "tiny" and "tiny-draft" through engine.measure's model
registry, converted to any precision, so AppTests drive every page in seconds.
"""
from dataclasses import replace

import torch

from engine.infer.loader import LoadedModel
from engine.infer.model import ModelConfig, Transformer
from engine.quant import QuantSpec, check_supported, quantize_model, quantized_fraction, weight_breakdown

TINY_MODELS = {"tiny": (0, "tiny: random-init test model"), "tiny-draft": (1, "tiny-draft: random-init test draft")}


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


def make_tiny(name: str, spec, device: str) -> LoadedModel:
    """A registered tiny model at `spec`, its fp32 quality reference cached as for a real model."""
    check_supported(spec, device)
    lm = tiny_model(seed=TINY_MODELS[name][0])
    model = lm.model
    if spec.precision != "fp32":
        try:
            model = quantize_model(model, spec, device)
        except Exception:  # the tiny model's 32-wide layers are narrower than int4 groups of 64/128
            model = quantize_model(model, replace(spec, group_size=32), device)
    _cache_reference(name)
    return replace(lm, name=name, spec=spec, model=model, weights=weight_breakdown(model),
                   quantized=quantized_fraction(model))


REFERENCE_TOKENS = (256, 1024)  # RunConfig's quality_tokens default, and the Precision page's


def _cache_reference(name: str) -> None:
    """Cache the fp32 reference as for a real model: tiny models cannot be loaded at fp32 by name.

    Computing it from the fp32 copy also tells engine.measure.quality what these weights are (a
    hash of the state dict), so the quantized copies, which have no files, find the same reference.
    """
    from engine.measure import quality

    ref = replace(tiny_model(seed=TINY_MODELS[name][0]), name=name)
    for n in REFERENCE_TOKENS:
        quality.ensure_reference(name, ref.folder, quality.eval_docs(ref.tokenizer, n), ref_lm=ref)


def register() -> None:
    from engine.measure.pool import register_model

    for name, (_, label) in TINY_MODELS.items():
        register_model(name, lambda spec, device, name=name: make_tiny(name, spec, device), label)
