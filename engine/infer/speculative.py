"""Speculative decoding: proposers, lossless verification, cache rollback and acceptance stats.

Loop invariant (all sequences share one slot counter, see model.py): `n` tokens are committed; the
target's cache is valid for slots < n-1; the last committed token has not been fed to it yet.
One round: the proposer drafts g tokens; the target scores [last, d1..dg] in one pass (g+1 logits);
verification keeps a prefix and adds one target token. Rolling back is just the new, smaller n:
stale cache entries past it are overwritten next round and never attended to before that.

With batch > 1 every sequence keeps k = min over the batch of its accepted count, then one token
chosen by the target (its draft token if it accepted more than k, else its resample or bonus).
Each kept token is distributed exactly as the target's, so output stays lossless.
"""
from __future__ import annotations

import time

import torch

from engine.common.errors import UserError
from engine.infer.spec_stats import SpecStats
from engine.infer.verify import verify
from engine.infer.generate import GenerationResult, _sync
from engine.infer.sampling import SamplingParams, make_generator, probs_from_logits
from engine.infer.tokens import StreamDecoder, check_length, encode_prompts, eos_ids, left_pad, pad_id

from engine.common.vocab import DRAFT_KINDS, MAX_GAMMA  # noqa: E402


# ---------------------------------------------------------------- proposers

class ModelProposer:
    """A draft model (another model of the family, or the target's own weights at lower precision)."""

    def __init__(self, lm, kind: str):
        self.lm, self.kind = lm, kind
        self.valid = 0  # draft cache valid for slots < valid

    def start(self, toks: torch.Tensor, pad: torch.Tensor, max_slots: int):
        self.pad = pad
        self.cache = self.lm.model.new_cache(toks.shape[0], max_slots)
        self.lm.model(toks, 0, self.cache, pad, last_only=True)
        self.valid = toks.shape[1]

    def propose(self, seq: torch.Tensor, n: int, g: int, sp: SamplingParams, gen, vocab: int):
        """seq [B, >=n] holds committed tokens; returns drafts [B, g] and their probs [B, g, V]."""
        model = self.lm.model
        feed = seq[:, self.valid:n]
        toks, probs = [], []
        slot = self.valid
        for _ in range(g):
            logits = model(feed, slot, self.cache, self.pad, last_only=True)[:, -1]
            slot += feed.shape[1]
            q = probs_from_logits(_fit_vocab(logits, vocab), sp)
            d = q.argmax(-1) if sp.greedy else torch.multinomial(q, 1, generator=gen).squeeze(-1)
            toks.append(d)
            probs.append(q)
            feed = d[:, None]
        self.valid = slot  # the last draft token was not fed
        return torch.stack(toks, 1), torch.stack(probs, 1)

    def kv_bytes(self) -> int:
        return self.cache.nbytes()

    def rollback(self, n: int):
        # Committed tokens at slots < n-1 are in the cache iff they were fed; keep what matches.
        self.valid = min(self.valid, n - 1)


class NgramProposer:
    """Prompt lookup: continue the latest earlier match of the last n tokens (n = max_n..1)."""

    kind = "ngram"

    def __init__(self, max_n: int = 3):
        self.max_n = max_n

    def start(self, toks, pad, max_slots):
        self.pad = pad.tolist()

    def _one(self, row: list[int], g: int) -> list[int]:
        for n in range(min(self.max_n, len(row) - 1), 0, -1):
            tail = row[-n:]
            for s in range(len(row) - n - 1, -1, -1):
                if row[s:s + n] == tail:
                    cont = row[s + n:s + n + g]
                    if cont:
                        return cont
        return []

    def propose(self, seq, n, g, sp, gen, vocab):
        rows = seq[:, :n].tolist()
        props = [self._one(r[p:], g) for r, p in zip(rows, self.pad)]
        width = max(len(p) for p in props)
        if width == 0:
            return None, None
        # Short proposals are padded by repeating their last token (or the last committed one):
        # any deterministic draft is verified losslessly, padding only costs acceptance.
        out = [(p or [r[-1]]) + [(p or [r[-1]])[-1]] * (width - len(p or [r[-1]])) for p, r in zip(props, rows)]
        return torch.tensor(out, device=seq.device), None

    def rollback(self, n):
        pass


def _fit_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    if logits.shape[-1] == vocab:
        return logits
    if logits.shape[-1] > vocab:
        return logits[..., :vocab]
    pad = torch.full((*logits.shape[:-1], vocab - logits.shape[-1]), float("-inf"), device=logits.device)
    return torch.cat([logits, pad], -1)


# ---------------------------------------------------------------- compatibility

PROBES = ("def main():\n    return 0\n", "Hello, world! ", "  \t\n", "数据", "<|im_start|>user\n", "x = [1, 2, 3]")


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


def make_proposer(kind: str, draft_lm=None, target_lm=None, ngram_max: int = 3):
    if kind == "ngram":
        return NgramProposer(ngram_max)
    if kind in ("model", "self"):
        if draft_lm is None:
            raise UserError(f"draft kind '{kind}' needs a draft model", "load a draft model or use ngram")
        if kind == "self" and target_lm is not None and draft_lm.folder != target_lm.folder:
            raise UserError("a self-draft must be the target's own weights", "use draft kind 'model' for another model")
        check_compatible(target_lm.tokenizer, draft_lm.tokenizer)
        return ModelProposer(draft_lm, kind)
    raise UserError(f"unknown draft kind '{kind}'", f"use one of: {', '.join(DRAFT_KINDS)}")


# ---------------------------------------------------------------- the loop

@torch.inference_mode()
def generate_speculative(target, proposer, prompts, max_new_tokens: int = 64, gamma: int = 4,
                         adaptive: bool = False, sampling: SamplingParams | None = None, on_token=None,
                         chat: bool = True, prompt_ids=None, stop_at_eos: bool = True) -> GenerationResult:
    """Speculative generation; the output is distributed exactly as target-only generation."""
    sp = (sampling or SamplingParams()).validate()
    g_max = check_gamma(gamma)
    g = g_max if not adaptive else min(2, g_max)
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    ids = prompt_ids if prompt_ids is not None else encode_prompts(target.tokenizer, prompts, chat)
    model, dev, cfg = target.model, target.device, target.cfg
    longest = max(len(x) for x in ids)
    check_length(cfg, longest, max_new_tokens, extra=g_max + 1)
    tok = target.tokenizer
    eos = eos_ids(target) if stop_at_eos else set()
    pid = pad_id(tok)
    toks, pad = left_pad(ids, pid, dev)
    b = len(ids)
    max_slots = longest + max_new_tokens + g_max + 1
    cache = model.new_cache(b, max_slots)
    gen = make_generator(sp, dev)
    stats = SpecStats(proposer.kind, g_max, adaptive, position_drafted=[0] * g_max, position_accepted=[0] * g_max)
    seq = torch.full((b, max_slots), pid, dtype=torch.long, device=dev)
    seq[:, :longest] = toks
    out: list[list[int]] = [[] for _ in range(b)]
    trace: list[list[str]] = [[] for _ in range(b)]
    done, finish = [False] * b, ["length"] * b
    steps: list[float] = []
    vocab = cfg.vocab_size

    streams = [StreamDecoder(tok) for _ in range(b)]
    pending: list[tuple[int, int, str]] = []  # tokens of this round, streamed after its timer stops

    def stream():
        # Outside the timed round, as in generate(): detokenizing and redrawing a UI are not decoding.
        if on_token:
            for i, t, origin in pending:
                on_token(i, t, streams[i].push(t), origin)
        pending.clear()

    def emit(i, t, origin):
        if done[i]:
            return
        out[i].append(t)
        trace[i].append(origin)
        pending.append((i, t, origin))
        if t in eos:
            done[i], finish[i] = True, "eos"
        elif len(out[i]) >= max_new_tokens:
            done[i] = True

    t0 = time.perf_counter()
    logits = model(toks, 0, cache, pad, last_only=True)[:, -1]
    first = logits.argmax(-1) if sp.greedy else torch.multinomial(probs_from_logits(logits, sp), 1, generator=gen)[:, 0]
    proposer.start(toks, pad, max_slots)
    _sync(dev)
    ttft = time.perf_counter() - t0
    seq[:, longest] = first
    n = longest + 1
    for i, t in enumerate(first.tolist()):
        emit(i, t, "target")
    stream()

    while not all(done):
        ts = time.perf_counter()
        room = min(max_new_tokens - len(o) for o, dn in zip(out, done) if not dn)
        g_now = max(0, min(g, room - 1))
        drafts, q = (proposer.propose(seq, n, g_now, sp, gen, vocab) if g_now > 0 else (None, None))
        _sync(dev)
        td = time.perf_counter()
        stats.draft_s += td - ts
        gd = 0 if drafts is None else drafts.shape[1]
        feed = seq[:, n - 1:n] if gd == 0 else torch.cat([seq[:, n - 1:n], drafts], 1)
        logits = model(feed, n - 1, cache, pad)
        p = probs_from_logits(logits, sp)
        if gd == 0:
            nxt = p[:, 0].argmax(-1) if sp.greedy else torch.multinomial(p[:, 0], 1, generator=gen)[:, 0]
            acc = torch.zeros(b, dtype=torch.long, device=dev)
        else:
            acc, nxt = verify(p, q, drafts, sp, gen)
        _sync(dev)
        stats.verify_s += time.perf_counter() - td
        k = int(acc.min())
        live = [i for i in range(b) if not done[i]]
        if gd:
            stats.rounds += len(live)
            stats.gamma_history.append(gd)
            for i in live:
                a_i = int(acc[i])
                stats.drafted += gd
                stats.accepted += a_i
                for j in range(gd):
                    stats.position_drafted[j] += 1
                    stats.position_accepted[j] += int(j < a_i)
        # Commit k draft tokens plus one target-chosen token per sequence.
        new = torch.empty(b, k + 1, dtype=torch.long, device=dev)
        if k:
            new[:, :k] = drafts[:, :k]
        last = torch.where(acc > k, drafts[:, k] if gd > k else nxt, nxt)
        new[:, k] = last
        seq[:, n:n + k + 1] = new
        before = [len(o) for o in out]
        for i in range(b):
            for j in range(k):
                emit(i, int(new[i, j]), "accepted")
            origin = "accepted" if int(acc[i]) > k else ("bonus" if k == gd and gd > 0 else
                                                         ("resample" if gd > 0 else "target"))
            emit(i, int(new[i, k]), origin)
        if gd:
            stats.emitted += sum(len(o) - bf for o, bf, i in zip(out, before, range(b)) if i in live)
        n += k + 1
        proposer.rollback(n)
        steps.append(time.perf_counter() - ts)
        stream()
        if adaptive and gd:
            g = min(g + 2, g_max) if k == gd else max(g - 1, 1)
    total = time.perf_counter() - t0
    texts = [tok.decode(o, skip_special_tokens=True) for o in out]
    res = GenerationResult(ids, out, texts, ttft, steps, ttft, total, finish, spec=None, trace=trace,
                           kv_bytes=cache.nbytes() + getattr(proposer, "kv_bytes", lambda: 0)())
    res.spec = stats.to_dict()
    res.spec_stats = stats
    return res
