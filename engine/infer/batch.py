"""Continuous batching: sequences with their own cache slots, and one step over a ragged batch.

Invariant per sequence (`tokens` = prompt + committed output): the target's cache holds K/V for
positions < len(tokens) - 1 once the prompt is prefilled; the last committed token is fed next.
One step runs, in a single target forward pass:
- for each decoding sequence, its last token and its g_i draft tokens (g_i = 0 without a draft):
  verification keeps the accepted prefix and adds the target's own token, so each sequence
  advances by its own accepted count (nothing is truncated to the batch's minimum);
- prefill chunks of sequences still reading their prompt; a chunk that finishes a prompt yields
  that sequence's first token.
Each sequence samples with its own generator, so a request's tokens do not depend on which other
requests share its steps.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch

from engine.infer import moe
from engine.infer.model import Rows
from engine.infer.sampling import SamplingParams, make_generator, penalize, pick, probs_from_logits
from engine.infer.spec_stats import SpecStats
from engine.infer.tokens import StreamDecoder
from engine.infer.verify import verify


@dataclass(eq=False)  # a request is itself, not its fields: two equal asks are still two requests
class Request:
    """What a caller asks for; prompt_ids are already encoded (chat template applied)."""

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_at_eos: bool = True
    min_tokens: int = 0  # EOS and stops do not end the sequence before this many new tokens (vLLM's min_tokens)
    stop: tuple[str, ...] = ()  # the text ends before the first of these; finish "stop"
    stop_token_ids: frozenset[int] = frozenset()  # vLLM's: these tokens end the sequence, their text left out
    on_token: Callable | None = None  # (seq, token, text piece, origin), called after the step's timer
    logprobs: int | None = None  # record each new token's logprob and its top-n alternatives (0: the token's only)
    prompt_logprobs: int | None = None  # the same for every prompt token (the first has None); then
    # max_new_tokens may be 0: the sequence ends after its prefill (lm-evaluation-harness's loglikelihood)
    request_id: str = ""
    # Choice i > 0 of an n-choice request: copies choice 0's prompt K/V instead of prefilling it again
    # (all but the prompt's last chunk, which it prefills itself at the same boundaries: the same numbers).
    prefix_from: "Request | None" = None
    uid: int = field(default_factory=lambda: next(_UIDS))  # unique in the process (id() is reused)


_UIDS = itertools.count(1)


class TokenLogprob(NamedTuple):
    """One token's log probability under the model and the top-n alternatives [(id, logprob)], best first."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


def logprob_rows(logits: torch.Tensor) -> torch.Tensor:
    """The log probabilities we report: log-softmax of the target's raw logits (temperature 1, before
    temperature, top-k, top-p, penalties and logit_bias), i.e. the model's own distribution whatever the
    sampling settings. vLLM v1's default ("raw_logprobs"); lm-evaluation-harness scores with exactly this."""
    return torch.log_softmax(logits.float(), dim=-1)


def logprob_entries(lp: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprob]:
    """Entries for rows of logprob_rows(...) [R, V] and the token each row chose."""
    chosen = lp.gather(1, torch.tensor(tokens, device=lp.device)[:, None])[:, 0].tolist()
    if top:
        v, i = torch.topk(lp, min(top, lp.shape[-1]), dim=-1)
        alts = [list(zip(ii, vv)) for ii, vv in zip(i.tolist(), v.tolist())]
    else:
        alts = [[] for _ in tokens]
    return [TokenLogprob(t, c, a) for t, c, a in zip(tokens, chosen, alts)]


@dataclass
class Sequence:
    req: Request
    slot: int
    vocab: int
    tokens: list[int]
    n_prompt: int
    gamma: int = 0  # this round's draft length (adaptive gamma moves it per sequence)
    prefilled: int = 0  # positions whose K/V the target's cache holds (while prefilling)
    recompute_to: int = 0  # after a preemption: the positions to prefill again before decoding resumes
    out: list[int] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    finish: str | None = None  # "eos" | "stop" | "length" | "cancelled" | "error" (then `error` says why)
    error: BaseException | None = None
    gen: torch.Generator | None = None
    stream: StopText | None = None
    t_admit: float = 0.0  # when the sequence got its slot
    t_first: float | None = None
    token_times: list[float] = field(default_factory=list)
    pending: list[tuple[int, str]] = field(default_factory=list)  # emitted this step, not yet streamed
    spec_stats: SpecStats = field(default_factory=lambda: SpecStats("none", 0, False))  # this sequence's rounds
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token of `out`, when req.logprobs is set
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)  # per prompt token, when asked
    lp_rows: torch.Tensor | None = None  # this round's logprob_rows: row j for the j-th token _emit commits
    lp_next: int = 0

    @property
    def sampling(self) -> SamplingParams:
        return self.req.sampling

    @property
    def prefill_end(self) -> int:
        """Positions to prefill: the prompt, or after a preemption every committed token but the last."""
        return max(self.n_prompt, self.recompute_to)

    @property
    def decoding(self) -> bool:
        return self.prefilled >= self.prefill_end and self.finish is None

    @property
    def cached_len(self) -> int:
        """Positions of committed tokens whose K/V the target's cache holds."""
        return len(self.tokens) - 1 if self.decoding else self.prefilled

    @property
    def room(self) -> int:
        return self.req.max_new_tokens - len(self.out)


@dataclass
class StepStats:
    wall_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    decode_rows: int = 0
    prefill_rows: int = 0
    decode_seqs: int = 0
    emitted: int = 0  # tokens committed by decoding sequences this step (prefill first tokens excluded)
    first_tokens: int = 0
    draft_passes: int = 0  # batched draft passes (the longest draft asked for), 0 when nothing was drafted
    draft_feed_rows: int = 0  # rows of a draft model's first pass: more than a round's when it caught up
    draft_prefill_s: float = 0.0  # the draft's share of the step's prompt chunks (part of draft_s)
    # (asked, drafted, accepted) per decoding sequence that asked for drafts (a lookup may propose fewer, or none)
    rounds: list[tuple[int, int, int]] = field(default_factory=list)


class Batch:
    """The target (and a proposer) over `slots` cache slots of `capacity` positions each."""

    def __init__(self, target, slots: int, capacity: int, eos: set[int], proposer=None, gamma: int = 0,
                 adaptive: bool = False, cache=None):
        self.target, self.eos = target, eos
        self.cache = cache if cache is not None else target.model.new_cache(slots, capacity)
        self.proposer, self.gamma_max, self.adaptive = proposer, gamma if proposer else 0, adaptive
        self.slots, self.capacity = slots, capacity
        self.vocab = target.cfg.vocab_size
        # Tests only, off by default: called with None before each forward (raise: the step fails) and with
        # each sequence after its sampling (raise: that sequence fails, the others go on).
        self.fault_injection: Callable[[Sequence | None], None] | None = None
        self.pad_drafts = False  # the step-cost profile: a lookup draft padded to its full length
        # False while a speculation policy drafts nothing: a draft model skips the prompts' chunks then and
        # catches up (ModelProposer.propose) if drafting resumes, so a policy at g = 0 costs no draft work
        self.draft_prefill = True

    def new_sequence(self, req: Request, slot: int) -> Sequence:
        g = self.gamma_max if not self.adaptive else min(2, self.gamma_max)
        stats = SpecStats(self.proposer.kind if self.proposer else "none", self.gamma_max, self.adaptive,
                          position_drafted=[0] * self.gamma_max, position_accepted=[0] * self.gamma_max,
                          accepted_hist=[0] * (self.gamma_max + 1))
        return Sequence(req, slot, self.vocab, list(req.prompt_ids), len(req.prompt_ids), gamma=g,
                        gen=make_generator(req.sampling, self.target.device),
                        stream=StopText(StreamDecoder(self.target.tokenizer), req.stop),
                        t_admit=time.perf_counter(), spec_stats=stats)

    def free(self, seq: Sequence) -> None:
        if self.proposer is not None:
            self.proposer.free(seq.slot)

    def kv_bytes(self) -> int:
        return self.cache.nbytes() + (self.proposer.kv_bytes() if self.proposer else 0)

    def share_prefix(self, src: Sequence, dst: Sequence, n: int) -> int:
        """dst starts with src's first n prompt positions, K/V (the draft's too) and prompt logprobs.
        A paged cache shares src's whole blocks (held twice, computed once) and dst prefills the rest."""
        if self.cache.paged:
            n = n // self.cache.block_size * self.cache.block_size
            if n == 0 or self.cache.blocks.trimmed[src.slot]:  # less than a block to share, or src's first
                return 0                                          # blocks went back behind a window: dst prefills alone
            self.cache.blocks.share(src.slot, dst.slot, n // self.cache.block_size)
            self.cache.sync(dst.slot)
        else:
            self.cache.copy_prefix(src.slot, dst.slot, n)
        if self.proposer is not None:
            self.proposer.copy_prefix(src.slot, dst.slot, n)
        if dst.req.prompt_logprobs is not None:  # entry j is prompt token j's (None for the first)
            dst.prompt_logprobs = list(src.prompt_logprobs[:n + 1])
        dst.prefilled = n
        return n

    # ------------------------------------------------------------ one step

    @torch.inference_mode()
    def step(self, decode: list[Sequence], prefill: list[tuple[Sequence, int]]) -> StepStats:
        """Advance `decode` sequences by one round and prefill (seq, rows) chunks; returns what happened."""
        st = StepStats(decode_seqs=len(decode))
        t0 = time.perf_counter()
        dev = self.target.device
        gs = [max(0, min(s.gamma, s.room - 1)) for s in decode]
        drafts, dprobs = [[] for _ in decode], None
        if self.proposer is not None and decode and any(gs):
            drafts, dprobs = self.proposer.propose(decode, gs)
            st.draft_passes, st.draft_feed_rows = max(gs), getattr(self.proposer, "feed_rows", 0)
            if self.pad_drafts and dprobs is None:  # the profile times full rows; any draft verifies losslessly
                drafts = [d + [s.tokens[-1]] * (g - len(d)) for s, d, g in zip(decode, drafts, gs)]
            _sync(dev)
        chunks = [(s, s.prefilled, n) for s, n in prefill]
        if self.proposer is not None and chunks and self.draft_prefill:
            t = time.perf_counter()
            self.proposer.prefill(chunks)
            _sync(dev)
            st.draft_prefill_s = time.perf_counter() - t
        t_draft = time.perf_counter()
        st.draft_s = t_draft - t0

        segs, toks, want = [], [], []  # want: rows whose logits we need
        for s, d in zip(decode, drafts):
            p0 = len(s.tokens) - 1
            segs.append((s.slot, p0, 1 + len(d)))
            want += range(len(toks), len(toks) + 1 + len(d))
            toks += [s.tokens[-1]] + d
        for s, p0, n in chunks:
            segs.append((s.slot, p0, n))
            toks += s.tokens[p0:p0 + n]
            if s.recompute_to:  # K/V of tokens already committed: no logits wanted
                continue
            if s.req.prompt_logprobs is not None:  # every row: row r predicts prompt token p0 + r + 1
                want += range(len(toks) - n, len(toks))
            elif p0 + n == s.n_prompt:
                want.append(len(toks) - 1)
        st.decode_rows = sum(1 + len(d) for d in drafts)
        st.prefill_rows = sum(n for _, _, n in chunks)
        if self.fault_injection is not None:
            self.fault_injection(None)
        with moe.step_kind(_step_kind(drafts, chunks)):  # an MoE target counts its experts touched by kind
            logits = self.target.model.forward_rows(torch.tensor(toks, device=dev), Rows.of(segs, dev), self.cache,
                                                    logits_at=torch.tensor(want, dtype=torch.long, device=dev))
        row = 0
        for i, (s, d) in enumerate(zip(decode, drafts)):
            lg = logits[row:row + 1 + len(d)]
            row += 1 + len(d)
            if s.req.logprobs is not None:  # from the raw logits, before any sampling setting touches them
                s.lp_rows, s.lp_next = logprob_rows(lg), 0
            q = dprobs[i] if (dprobs is not None and d) else None
            try:  # sampling and verification are one sequence's: a failure there ends that sequence only
                st.emitted += self._verify_and_commit(s, lg, d, q, st, gs[i])
                self._inject(s)
            except Exception as e:  # noqa: BLE001
                fail(s, e)
        for s, p0, n in chunks:
            s.prefilled = p0 + n
            if s.recompute_to:
                continue
            if s.req.prompt_logprobs is not None:
                try:
                    self._prompt_logprobs(s, p0, n, logits[row:row + n])
                except Exception as e:  # noqa: BLE001
                    fail(s, e)
                row += n - 1
                if s.prefilled != s.n_prompt:
                    row += 1
            if s.prefilled == s.n_prompt:
                lg = logits[row:row + 1]
                row += 1
                if s.req.max_new_tokens == 0 or s.finish is not None:  # prompt logprobs only (or it failed)
                    s.finish = s.finish or "length"
                    continue
                if s.req.logprobs is not None:
                    s.lp_rows, s.lp_next = logprob_rows(lg), 0
                try:
                    tok = int(pick(penalize(lg, s.sampling, s.tokens, s.n_prompt), s.sampling, s.gen)[0])
                    s.t_first = time.perf_counter()
                    self._emit(s, tok, "target")
                    st.first_tokens += 1
                    self._inject(s)
                except Exception as e:  # noqa: BLE001
                    fail(s, e)
        _sync(dev)
        st.verify_s = time.perf_counter() - t_draft
        st.wall_s = time.perf_counter() - t0
        return st

    def _prompt_logprobs(self, s: Sequence, p0: int, n: int, lg: torch.Tensor) -> None:
        """Entries for prompt tokens p0+1 .. p0+n from this chunk's rows (a chunk at a time: never [prompt, V])."""
        if p0 == 0:
            s.prompt_logprobs.append(None)  # nothing predicts the first token (OpenAI and vLLM say null)
        m = min(n, s.n_prompt - 1 - p0)  # the last prompt row predicts the first new token, not a prompt token
        if m > 0:
            s.prompt_logprobs += logprob_entries(logprob_rows(lg[:m]), s.tokens[p0 + 1:p0 + 1 + m],
                                                 s.req.prompt_logprobs)

    def _inject(self, s: Sequence) -> None:
        if self.fault_injection is not None:
            self.fault_injection(s)

    def _verify_and_commit(self, s: Sequence, logits: torch.Tensor, d: list[int], q, st: StepStats,
                           asked: int = 0) -> int:
        """Accept a prefix of the drafts d (of `asked` requested) and add the target's token; returns the tokens
        committed."""
        g = len(d)
        # Row j is the target's distribution after drafts[:j]: penalties count those drafts as committed.
        logits = penalize(logits, s.sampling, s.tokens, s.n_prompt, d)
        if g == 0:
            if asked:
                st.rounds.append((asked, 0, 0))  # the proposer found nothing: the policy counts what it proposes
            self._emit(s, int(pick(logits[:1], s.sampling, s.gen)[0]), "target")
            return 1
        p = logits if s.sampling.greedy else probs_from_logits(logits, s.sampling)  # greedy reads the argmax only
        a, n = verify(p[None], None if q is None else q[None], torch.tensor([d], device=p.device), s.sampling, s.gen)
        acc, nxt = int(a[0]), int(n[0])
        before = len(s.out)
        for j in range(acc):
            if s.finish is None:
                self._emit(s, d[j], "accepted")
        if s.finish is None:
            self._emit(s, nxt, "bonus" if acc == g else "resample")
        committed = len(s.out) - before
        s.spec_stats.count_round(g, acc, committed)
        st.rounds.append((max(asked, g), g, acc))
        if self.proposer is not None:
            self.proposer.rollback(s)
        if self.adaptive:
            s.gamma = min(s.gamma + 2, self.gamma_max) if acc == g else max(s.gamma - 1, 1)
        return committed

    def _emit(self, s: Sequence, tok: int, origin: str) -> None:
        if s.lp_rows is not None:  # the j-th token of a round is drawn from (or checked against) row j
            s.logprobs += logprob_entries(s.lp_rows[s.lp_next:s.lp_next + 1], [tok], s.req.logprobs)
            s.lp_next += 1
        s.tokens.append(tok)
        s.out.append(tok)
        s.trace.append(origin)
        s.pending.append((tok, origin))
        s.token_times.append(time.perf_counter())
        armed = len(s.out) >= s.req.min_tokens
        if armed and tok in s.req.stop_token_ids:
            s.finish = "stop"
        elif armed and tok in self.eos and s.req.stop_at_eos:
            s.finish = "eos"
        elif len(s.out) >= s.req.max_new_tokens:
            s.finish = "length"


def fail(s: Sequence, e: BaseException) -> None:
    """End one sequence with an error; the scheduler retires it and the caller reports why."""
    s.finish, s.error = "error", e


def stream(s: Sequence) -> None:
    """Hand the tokens a step emitted to the request's callback (outside the timed step), and end the
    sequence at a stop string: its text ends before the string, and tokens past it are dropped (a
    speculative round can commit several in one step), so the usage counts what the client got."""
    if s.req.on_token is None and not s.req.stop:
        s.pending.clear()
        return
    first = len(s.out) - len(s.pending)  # index in s.out of the first pending token
    for j, (tok, origin) in enumerate(s.pending):
        n = first + j + 1  # tokens out, this one included
        if s.finish == "stop" and n == len(s.out) and tok in s.req.stop_token_ids:
            piece = ""  # a stop token's own text is left out, as vLLM does
        else:
            piece = s.stream.push(tok, armed=n >= s.req.min_tokens)
        if s.stream.stopped:
            if s.finish != "error":
                s.finish = "stop"
            del s.out[n:], s.tokens[s.n_prompt + n:], s.trace[n:], s.token_times[n:], s.logprobs[n:]
        if s.req.on_token is not None:
            s.req.on_token(s, tok, piece, origin)
        if s.stream.stopped:
            break
    s.pending.clear()


class StopText:
    """A sequence's text as it streams, ending before its first stop string.

    Text that may still be the start of a stop string is held back until the next tokens decide it,
    so a stop string never leaks into a streamed piece; concatenated pieces plus flush() are the
    text up to the stop (the whole text when none matched).
    """

    def __init__(self, decoder: StreamDecoder, stops: tuple[str, ...] = ()):
        self.dec, self.stops = decoder, tuple(stops)
        self.held = ""
        self.stopped = False

    def push(self, token: int, armed: bool = True) -> str:
        """The text to release after `token`; `armed` False (before min_tokens) releases it unchecked."""
        text = self.held + self.dec.push(token)
        if not self.stops or not armed:
            self.held = ""
            return text
        return self._cut(text, final=False)

    def flush(self) -> str:
        """What is still held at the end (nothing once a stop string matched)."""
        if self.stopped:
            return ""
        text = self.held + self.dec.flush()
        self.held = ""
        return self._cut(text, final=True) if self.stops else text

    def _cut(self, text: str, final: bool) -> str:
        hits = [i for i in (text.find(stop) for stop in self.stops) if i >= 0]
        if hits:
            self.stopped, self.held = True, ""
            return text[:min(hits)]
        keep = 0 if final else max((k for stop in self.stops for k in range(min(len(stop) - 1, len(text)), 0, -1)
                                    if text.endswith(stop[:k])), default=0)
        self.held = text[len(text) - keep:]
        return text[:len(text) - keep]


def _step_kind(drafts: list[list[int]], chunks: list) -> str:
    """decode | verify | prefill | mixed (engine.infer.moe.STEP_KINDS): verify when a sequence brings drafts."""
    if not chunks:
        return "verify" if any(drafts) else "decode"
    return "mixed" if drafts else "prefill"


def _sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
