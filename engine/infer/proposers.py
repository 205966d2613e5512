"""Draft proposers for speculative decoding, per sequence inside a continuous batch.

A proposer drafts up to g tokens for each decoding sequence from that sequence's committed tokens.
- NgramProposer (prompt lookup): continue the latest earlier match of the last n tokens; no model.
- SuffixProposer (engine/infer/suffix.py): suffix decoding, a suffix tree of the request's own tokens and of
  earlier outputs; no model.
- ModelProposer: a draft model (another model of the family, or the target's own weights at a lower
  precision) with its own KV cache, slot for slot the target's. It mirrors the target's prefill
  chunks, drafts with batched one-row steps, and rolls back per sequence after verification.
"""
from __future__ import annotations

import torch

from engine.common.errors import UserError
from engine.common.vocab import DRAFT_KINDS, MAX_GAMMA
from engine.infer.model import Rows
from engine.infer.sampling import probs_from_logits

PROBES = ("def main():\n    return 0\n", "Hello, world! ", "  \t\n", "数据", "<|im_start|>user\n", "x = [1, 2, 3]")


class NgramProposer:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the last n tokens."""

    kind = "ngram"
    has_probs = False  # deterministic drafts: q = 1 on the proposed token

    def __init__(self, max_n: int = 3):
        self.max_n = max_n

    def build(self, slots: int, capacity: int) -> "NgramProposer":
        return self  # no state per sequence: a proposer and its own spec

    def lookup(self, row: list[int], g: int) -> list[int]:
        for n in range(min(self.max_n, len(row) - 1), 0, -1):
            tail = row[-n:]
            for s in range(len(row) - n - 1, -1, -1):
                if row[s:s + n] == tail:
                    cont = row[s + n:s + n + g]
                    if cont:
                        return cont
        return []

    def prefill(self, chunks) -> None:
        pass

    def propose(self, seqs, gs):
        """Drafts per sequence (possibly fewer than g_i, or none) and no draft probabilities."""
        return [self.lookup(s.tokens, g) if g > 0 else [] for s, g in zip(seqs, gs)], None

    def rollback(self, seq) -> None:
        pass

    def free(self, slot: int) -> None:
        pass

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        pass  # it reads the sequence's own tokens

    def kv_bytes(self) -> int:
        return 0


class ModelProposer:
    """A draft model with its own cache; `fed[slot]` counts the committed tokens its cache holds."""

    has_probs = True

    def __init__(self, lm, kind: str, slots: int, capacity: int):
        self.lm, self.kind = lm, kind
        self.cache = lm.model.new_cache(slots, capacity)
        self.fed = [0] * slots
        self.feed_rows = 0  # rows of the last propose's first pass

    def prefill(self, chunks) -> None:
        """Feed the same prompt chunks the target prefills: (seq, first position, rows)."""
        if not chunks:
            return
        # A target that reused cached K/V (the prefix cache) starts past what this draft holds: it catches up.
        chunks = [(s, min(p0, self.fed[s.slot]), p0 + n - min(p0, self.fed[s.slot])) for s, p0, n in chunks]
        dev = self.lm.device
        toks = torch.tensor([t for s, p0, n in chunks for t in s.tokens[p0:p0 + n]], device=dev)
        self.lm.model.forward_rows(toks, Rows.of([(s.slot, p0, n) for s, p0, n in chunks], dev), self.cache,
                                   logits_at=torch.empty(0, dtype=torch.long, device=dev))
        for s, p0, n in chunks:
            self.fed[s.slot] = p0 + n

    def propose(self, seqs, gs):
        """g_i drafts per sequence from g_max batched steps; returns (drafts, probs [g_i, V] per sequence)."""
        dev = self.lm.device
        drafts = [[] for _ in seqs]
        probs = [[] for _ in seqs]
        live = [i for i, g in enumerate(gs) if g > 0]
        step = 0
        while live:
            segs, toks, last = [], [], []
            for i in live:
                s = seqs[i]
                feed = s.tokens[self.fed[s.slot]:] if step == 0 else [drafts[i][-1]]
                segs.append((s.slot, self.fed[s.slot], len(feed)))
                toks += feed
                last.append(len(toks) - 1)
            if step == 0:  # beyond one round's tokens per sequence: a catch-up on what it skipped (StepStats)
                self.feed_rows = len(toks)
            logits = self.lm.model.forward_rows(torch.tensor(toks, device=dev), Rows.of(segs, dev), self.cache,
                                                logits_at=torch.tensor(last, device=dev))
            for row, i in enumerate(live):
                s = seqs[i]
                self.fed[s.slot] += segs[row][2]
                q = probs_from_logits(fit_vocab(logits[row], s.vocab), s.sampling)
                d = int(q.argmax()) if s.sampling.greedy else int(torch.multinomial(q, 1, generator=s.gen))
                drafts[i].append(d)
                probs[i].append(q)
            step += 1
            live = [i for i in live if len(drafts[i]) < gs[i]]
        return drafts, [torch.stack(p) if p else None for p in probs]

    def owed(self, seq) -> int:
        """Positions the target's cache holds and this draft's does not (skipped while drafting nothing)."""
        return max(0, seq.cached_len - self.fed[seq.slot])

    def rollback(self, seq) -> None:
        # The cache holds what was fed; of that, only committed tokens are valid (the last committed
        # token is fed next round).
        self.fed[seq.slot] = min(self.fed[seq.slot], len(seq.tokens) - 1)

    def free(self, slot: int) -> None:
        self.fed[slot] = 0

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        n = min(n, self.fed[src])  # a draft that skipped its prefill (no drafting then) holds less
        self.cache.copy_prefix(src, dst, n)
        self.fed[dst] = n

    def kv_bytes(self) -> int:
        return self.cache.nbytes()


def fit_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Draft logits on the target's vocabulary size (a few padding ids can differ between sizes)."""
    if logits.shape[-1] == vocab:
        return logits
    if logits.shape[-1] > vocab:
        return logits[..., :vocab]
    pad = torch.full((*logits.shape[:-1], vocab - logits.shape[-1]), float("-inf"), device=logits.device)
    return torch.cat([logits, pad], -1)


# ---------------------------------------------------------------- choosing and checking a draft

def check_compatible(target_tok, draft_tok) -> None:
    """Refuse a draft whose tokenizer differs, naming the first difference."""
    va, vb = target_tok.get_vocab(), draft_tok.get_vocab()
    if va != vb:
        only_t = sorted(set(va) - set(vb))[:1]
        only_d = sorted(set(vb) - set(va))[:1]
        diff = next((k for k in sorted(va) if k in vb and va[k] != vb[k]), None)
        what = (f"token {only_t[0]!r} is only in the target's vocabulary" if only_t else
                f"token {only_d[0]!r} is only in the draft's vocabulary" if only_d else
                f"token {diff!r} has id {va[diff]} in the target but {vb[diff]} in the draft")
        raise UserError(f"draft and target tokenizers differ ({len(va)} vs {len(vb)} tokens; first difference: {what})",
                        "pick a draft from the same model family (same tokenizer), or use ngram or a self-draft")
    for s in PROBES:
        a, b = target_tok(s)["input_ids"], draft_tok(s)["input_ids"]
        if list(a) != list(b):
            raise UserError(f"draft and target encode {s!r} differently ({list(a)[:6]} vs {list(b)[:6]})",
                            "pick a draft with the same tokenizer")


def check_gamma(gamma: int) -> int:
    if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1 or gamma > MAX_GAMMA:
        raise UserError(f"gamma {gamma!r} is out of range", f"use an integer from 1 to {MAX_GAMMA}")
    return gamma


class ProposerSpec:
    """A checked draft configuration (from `proposer_spec`); the batch builds the proposer once it knows its slots."""

    def __init__(self, kind: str, draft_lm=None, ngram_max: int = 3):
        self.kind, self.draft_lm, self.ngram_max = kind, draft_lm, ngram_max

    def build(self, slots: int, capacity: int):
        if self.kind == "ngram":
            return NgramProposer(self.ngram_max)
        if self.kind == "suffix":
            from engine.infer.suffix import SuffixProposer

            return SuffixProposer(slots)
        return ModelProposer(self.draft_lm, self.kind, slots, capacity)


def proposer_spec(kind: str, draft_lm=None, target_lm=None, ngram_max: int = 3) -> ProposerSpec:
    """Check a draft configuration and return its spec; the proposer itself is built per batch
    (`ProposerSpec.build`), since a model draft needs a cache of the batch's slots."""
    if kind in ("ngram", "suffix"):
        return ProposerSpec(kind, ngram_max=ngram_max)
    if kind in ("model", "self"):
        if draft_lm is None:
            raise UserError(f"draft kind '{kind}' needs a draft model", "load a draft model or use ngram")
        if kind == "self" and target_lm is not None and draft_lm.folder != target_lm.folder:
            raise UserError("a self-draft must be the target's own weights", "use draft kind 'model' for another model")
        if target_lm is not None:
            check_compatible(target_lm.tokenizer, draft_lm.tokenizer)
        return ProposerSpec(kind, draft_lm)
    raise UserError(f"unknown draft kind '{kind}'", f"use one of: {', '.join(DRAFT_KINDS)}")
