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
from dataclasses import asdict, dataclass, field

import torch

from .errors import UserError
from .generate import (GenerationResult, SamplingParams, _sync, check_length, encode_prompts, eos_ids, left_pad,
                       make_generator, pad_id, probs_from_logits)

DRAFT_KINDS = ("none", "model", "self", "ngram")
MAX_GAMMA = 16


@dataclass
class SpecStats:
    """Per-request acceptance statistics.

    drafted/accepted: draft tokens proposed and kept, summed over sequences and rounds.
    acceptance_rate: accepted / drafted.
    mean_acceptance_length: tokens emitted per target verification pass, counting the bonus/resample
      token (vLLM's definition: 1 + accepted / rounds), per sequence.
    position_rate[i]: share of rounds in which draft position i (0-based) was accepted, of those
      in which it was proposed.
    expected_length: (1 - a^(g+1)) / (1 - a) for a = acceptance_rate and g = mean gamma: what an
      i.i.d. acceptance model predicts for mean_acceptance_length.
    draft_s / verify_s: wall time spent drafting and in target verification passes.
    """

    draft_kind: str
    gamma: int
    adaptive: bool
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    position_drafted: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    gamma_history: list[int] = field(default_factory=list)
    draft_s: float = 0.0
    verify_s: float = 0.0
    baseline_tok_s: float | None = None
    speedup: float | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        a = self.acceptance_rate
        d.update(acceptance_rate=a, mean_acceptance_length=self.mean_acceptance_length,
                 expected_length=self.expected_length, position_rate=self.position_rate,
                 mean_gamma=self.mean_gamma)
        return d

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_gamma(self) -> float:
        return sum(self.gamma_history) / len(self.gamma_history) if self.gamma_history else float(self.gamma)

    @property
    def mean_acceptance_length(self) -> float | None:
        return self.emitted / self.rounds if self.rounds else None

    @property
    def expected_length(self) -> float | None:
        return expected_length(self.acceptance_rate, self.mean_gamma)

    @property
    def position_rate(self) -> list[float | None]:
        return [a / d if d else None for a, d in zip(self.position_accepted, self.position_drafted)]


def expected_length(a: float | None, g: float) -> float | None:
    if a is None:
        return None
    if a >= 1.0:
        return g + 1.0
    return (1.0 - a ** (g + 1)) / (1.0 - a)


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


# ---------------------------------------------------------------- verification

def verify(p: torch.Tensor, q: torch.Tensor | None, d: torch.Tensor, sp: SamplingParams, gen):
    """Accepted counts [B] and the target's token after them [B], per sequence.

    p [B, g+1, V]: target probabilities; q [B, g, V] or None for a deterministic draft (q = 1 on d);
    d [B, g]: draft tokens. Greedy: accept while d equals the target's argmax, then the argmax.
    Sampling: accept d_i with probability min(1, p/q); at the first rejection sample from
    normalize(max(0, p - q)); after g acceptances sample the bonus from p_{g+1}.
    """
    b, g = d.shape
    if sp.greedy:
        best = p.argmax(-1)  # [B, g+1]
        ok = (best[:, :g] == d).int()
        acc = ok.cumprod(1).sum(1)
        return acc, best.gather(1, acc[:, None]).squeeze(1)
    pd = p[:, :g].gather(2, d[:, :, None]).squeeze(2)
    qd = torch.ones_like(pd) if q is None else q.gather(2, d[:, :, None]).squeeze(2)
    u = torch.rand(pd.shape, generator=gen, device=p.device)
    ok = (u * qd <= pd).int()  # u <= p/q without dividing by a zero q
    acc = ok.cumprod(1).sum(1)
    nxt = torch.empty(b, dtype=torch.long, device=p.device)
    for i in range(b):
        k = int(acc[i])
        if k == g:
            dist = p[i, g]
        else:
            qk = torch.nn.functional.one_hot(d[i, k], p.shape[-1]).float() if q is None else q[i, k]
            dist = (p[i, k] - qk).clamp(min=0)
            if float(dist.sum()) <= 0:  # p == q exactly: any rejection is measure-zero; fall back to p
                dist = p[i, k]
        nxt[i] = torch.multinomial(dist / dist.sum(), 1, generator=gen)
    return acc, nxt


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

    def emit(i, t, origin):
        if done[i]:
            return
        out[i].append(t)
        trace[i].append(origin)
        if on_token:
            on_token(i, t, tok.decode([t]), origin)
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
        if adaptive and gd:
            g = min(g + 2, g_max) if k == gd else max(g - 1, 1)
    total = time.perf_counter() - t0
    texts = [tok.decode(o, skip_special_tokens=True) for o in out]
    res = GenerationResult(ids, out, texts, ttft, steps, ttft, total, finish, spec=None, trace=trace)
    res.spec = stats.to_dict()
    res.spec_stats = stats
    return res
