"""Prompts to token ids and back: chat template, length checks, left padding, EOS and pad ids."""
from __future__ import annotations

import torch

from engine.common.errors import UserError


def encode_prompts(tokenizer, prompts: list[str], chat: bool) -> list[list[int]]:
    if not prompts or any(not isinstance(p, str) or not p.strip() for p in prompts):
        raise UserError("a prompt is empty", "give at least one non-empty prompt")
    out = []
    for p in prompts:
        if chat and getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
        else:
            ids = tokenizer(p)["input_ids"]
        out.append(list(ids))
    return out


def check_length(cfg, prompt_len: int, max_new_tokens: int, extra: int = 0) -> None:
    if max_new_tokens < 1:
        raise UserError(f"max_new_tokens is {max_new_tokens}", "ask for at least 1 new token")
    total = prompt_len + max_new_tokens + extra
    if total > cfg.max_position:
        raise UserError(
            f"prompt ({prompt_len} tokens) plus {max_new_tokens} new tokens is {total}, beyond the model's "
            f"context of {cfg.max_position}",
            f"shorten the prompt or ask for at most {max(cfg.max_position - prompt_len - extra, 0)} new tokens",
        )


def left_pad(batch: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(x) for x in batch)
    pad = torch.tensor([longest - len(x) for x in batch], dtype=torch.long, device=device)
    toks = torch.tensor([[pad_id] * (longest - len(x)) + x for x in batch], dtype=torch.long, device=device)
    return toks, pad


def eos_ids(lm) -> set[int]:
    tok_eos = getattr(lm.tokenizer, "eos_token_id", None)
    return set(lm.cfg.eos_token_ids) | ({tok_eos} if tok_eos is not None else set())


def pad_id(tokenizer) -> int:
    p = getattr(tokenizer, "pad_token_id", None)
    return p if p is not None else 0
