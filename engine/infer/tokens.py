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
    """Refuse a request that cannot fit the context, saying what would fit.

    `extra` is room the caller needs beyond the new tokens (speculation drafts gamma + 1 ahead).
    """
    if max_new_tokens < 1:
        raise UserError(f"max_new_tokens is {max_new_tokens}", "ask for at least 1 new token")
    ctx = cfg.max_position
    total = prompt_len + max_new_tokens + extra
    if total <= ctx:
        return
    room_for_new = ctx - prompt_len - extra
    room_for_prompt = ctx - max_new_tokens - extra
    problem = (f"prompt ({prompt_len} tokens) plus {max_new_tokens} new tokens"
               + (f" and {extra} of speculation headroom" if extra else "") + f" is {total}, beyond the model's "
               f"context of {ctx}")
    if room_for_new >= 1:
        fix = f"ask for at most {room_for_new} new tokens, or shorten the prompt to {max(room_for_prompt, 0)} tokens"
    elif room_for_prompt >= 1:
        fix = (f"shorten the prompt to at most {room_for_prompt} tokens (it is {prompt_len}) for {max_new_tokens} "
               "new tokens")
    else:
        fix = f"ask for fewer than {ctx - extra} new tokens and shorten the prompt; the context holds {ctx} in all"
    raise UserError(problem, fix)


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


class StreamDecoder:
    """Incremental detokenization for streaming: text pieces that never split a character.

    Byte-level BPE can spread one character (a CJK ideograph, an emoji) over several tokens;
    decoding each token alone prints U+FFFD. We decode a window that starts a few tokens back and
    emit only the new suffix, and only once it no longer ends in an incomplete character (the
    method of vLLM's and TGI's detokenizers). Concatenated pieces equal decode(all ids).
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tok, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # window start
        self.read = 0  # ids before this are already emitted

    def _text(self, ids) -> str:
        return self.tok.decode(ids, skip_special_tokens=self.skip)

    def push(self, token: int) -> str:
        """The new text after `token`; "" while a character is still incomplete."""
        self.ids.append(int(token))
        before = self._text(self.ids[self.prefix:self.read])
        after = self._text(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before):]
        return ""

    def flush(self) -> str:
        """Whatever is still held at the end (an incomplete character decodes as U+FFFD)."""
        before = self._text(self.ids[self.prefix:self.read])
        after = self._text(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return after[len(before):]
