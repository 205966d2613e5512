"""Tiny random-init models of every supported family, built offline by transformers, with a tokenizer.

`build(family, folder)` writes config.json, model.safetensors and a small byte-level BPE tokenizer,
so the folder loads through every path a user's model takes (engine.infer.loader.load by path,
`serve`, the dashboard). Shapes are small (2-3 layers, hidden 64) but exercise what the family
computes: sliding windows shorter than the test inputs, rope scaling whose original length the
inputs pass, soft-capping, q/k norms, MoE routing.
"""
from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 384
WINDOW = 24           # sliding windows: test inputs are longer than twice this
ROPE_ORIGINAL = 48    # rope scaling's original_max_position_embeddings: test inputs run past it
BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512)

FAMILIES: dict[str, tuple[str, dict]] = {
    "llama": ("llama", {}),
    "llama3.1": ("llama", dict(rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                                     low_freq_factor=1.0, high_freq_factor=4.0,
                                                     original_max_position_embeddings=ROPE_ORIGINAL))),
    "llama-linear": ("llama", dict(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0))),
    "llama-dynamic": ("llama", dict(max_position_embeddings=ROPE_ORIGINAL,
                                    rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=4.0))),
    "llama-yarn": ("llama", dict(rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                       original_max_position_embeddings=ROPE_ORIGINAL))),
    "mistral": ("mistral", dict(sliding_window=WINDOW, head_dim=16)),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", dict(head_dim=16)),
    "gemma2": ("gemma2", dict(head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=16,
                              attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    "gemma3": ("gemma3_text", dict(head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=16,
                                   layer_types=["sliding_attention", "sliding_attention", "full_attention"])),
    "gemma3-scaled": ("gemma3_text", dict(head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=16,
                                          layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                          rope_parameters={"full_attention": dict(rope_type="linear", factor=8.0,
                                                                                  rope_theta=1e6),
                                                           "sliding_attention": dict(rope_type="default",
                                                                                     rope_theta=1e4)})),
    "phi3": ("phi3", dict(sliding_window=WINDOW * 2)),
    "phi3-longrope": ("phi3", dict(rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                                                        short_factor=[1.0 + i / 8 for i in range(8)],
                                                        long_factor=[1.0 + i for i in range(8)],
                                                        original_max_position_embeddings=ROPE_ORIGINAL))),
    "phi4-partial": ("phi3", dict(num_attention_heads=2, num_key_value_heads=1,
                                  rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                       partial_rotary_factor=0.75))),
    "mixtral": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=None)),
    "qwen3-moe": ("qwen3_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                                    norm_topk_prob=True, head_dim=16)),
}


def hf_config(family: str, **overrides):
    from transformers import AutoConfig

    model_type, extra = FAMILIES[family]
    return AutoConfig.for_model(model_type, **{**BASE, **extra, **overrides})


def hf_model(family: str, seed: int = 0, **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(hf_config(family, **overrides), attn_implementation="eager")
    with torch.no_grad():  # Gemma's norms start at zero weight ((1 + w) scaling): give them something to do
        for n, p in m.named_parameters():
            if "norm" in n:
                p.normal_(0.0 if "gemma" in m.config.model_type else 1.0, 0.1)
    return m.eval()


def tokenizer(vocab: int = VOCAB):
    """A byte-level BPE of `vocab` tokens trained on a little text (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
            "The quick brown fox jumps over the lazy dog. " * 3, "import numpy as np\nprint(np.arange(10))\n"]
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(text, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def build(family: str, folder: Path, seed: int = 0, tokenizer_vocab: int = VOCAB, **overrides) -> Path:
    """Save a tiny `family` model (fp32 safetensors) and its tokenizer into `folder`."""
    folder = Path(folder)
    if not (folder / "config.json").exists():
        hf_model(family, seed, **overrides).save_pretrained(folder)
        tokenizer(tokenizer_vocab).save_pretrained(folder)
    return folder


PROBE_IDS = [1, 5, 9, 17, 33, 65, 129, 200, 250, 300, 7, 3]  # 12 positions inside every family's vocabulary


def max_kl(ref, lm, ids=PROBE_IDS) -> float:
    """The largest KL(transformers `ref` || our loaded model `lm`) over the positions of `ids`, one prefill."""
    t = torch.tensor([ids])
    with torch.no_grad():
        want = torch.log_softmax(ref(t).logits[0].float(), -1)
        got = torch.log_softmax(lm.model(t, 0, lm.model.new_cache(1, len(ids) + 4))[0], -1)
    return float((want.exp() * (want - got)).sum(-1).max())
