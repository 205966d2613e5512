"""The step policy of continuous batching: who runs in the next step, and how many tokens.

Settings (recorded in every record that uses them):
- max_seqs: cache slots, i.e. the most sequences running at once;
- max_model_len: positions per slot (prompt + new tokens + speculation headroom);
- max_batched_tokens: rows one step may run (decode rows plus prefill-chunk rows), vLLM's
  max_num_batched_tokens;
- step_factor: when > 0, max_batched_tokens and prefill_chunk are chosen when the server starts
  (prepare(), engine/infer/step_budget.py): the most prompt rows r that keep a step within step_factor
  decode steps, as measured on this step path; the chunk becomes at most r and the budget a decode round
  of every slot plus it;
- prefill_chunk: prompts are prefilled in chunks of this many tokens, at fixed boundaries (0,
  chunk, 2 chunk, ...), so a request's numbers do not depend on the load around it;
- max_waiting: requests queued beyond the running ones; past it, submit() refuses (the server
  answers 429 with Retry-After);
- kv_cache: "slots" reserves max_model_len positions per slot up front; "paged" (engine/infer/
  paged.py, blocks.py) holds blocks of block_size positions in a budget of kv_cache_gib GiB (0: as
  much as the slots would take), taken as sequences grow; prefix_caching reuses the cached blocks a
  prompt starts with; kv_dtype is the cached K/V's precision (auto: the compute dtype, int8, fp8).
  When every layer attends within a sliding window (Mistral), a sequence holds only its window: it
  is admitted with the blocks of its first prefill chunk, takes each next chunk's as it comes (one
  chunk a step, under either policy), and gives back the blocks behind its window after every step,
  so the default budget is what max_seqs such sequences hold (engine.common.formulas.sequence_blocks);
  windowed layers beside full ones (Gemma 2/3) do so in a pool of their own.

Policy, every step:
1. admit waiting requests into free slots, first come first served (a slot is freed the moment
   its sequence finishes or is cancelled); a paged cache admits a request only when the blocks of
   its prompt are there (preempted sequences first, oldest first), and gives each decoding sequence
   the blocks of its next round: when none are left it preempts the newest sequence (its blocks go
   back; it is admitted again later and prefills its committed tokens again, reusing whatever the
   prefix cache still holds), never touching another sequence's blocks;
2. "decode-first" (serving): every decoding sequence runs its round (1 + gamma rows); the rows left
   in the budget go to prefill chunks, oldest request first, whole chunks only, so decodes are never
   starved and a long prompt cannot stall the others for more than a chunk per step;
   "prefill-first" (a static batch, the benchmarks): all prompts are prefilled before any decode,
   so decode steps time decoding alone.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import asdict, dataclass

from engine.common.errors import UserError
from engine.common.setup import EngineSetup
from engine.common.vocab import KV_CACHES
from engine.infer.batch import Batch, Request, Sequence, StepStats, fail, stream
from engine.infer.paged import BLOCK_SIZE, kv_dtype_name

POLICIES = ("decode-first", "prefill-first")


def _arrival(s: Sequence) -> int:
    """Requests are numbered as they are made: the newest has the largest uid (preempted first)."""
    return s.req.uid


class QueueFull(Exception):
    """Every slot is busy and the waiting queue is full: try again later."""

    def __init__(self, retry_after_s: float):
        super().__init__(f"the server is at capacity; retry after {retry_after_s:.0f} s")
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class BatchSettings:
    max_seqs: int = 8
    max_model_len: int = 2048
    max_batched_tokens: int = 512
    prefill_chunk: int = 256
    max_waiting: int = 64
    policy: str = "decode-first"
    kv_cache: str = "slots"  # slots | paged
    kv_cache_gib: float = 0.0  # paged: the KV budget (0: what max_seqs slots of max_model_len would take)
    block_size: int = BLOCK_SIZE  # paged: positions per block (a multiple of the fused attention's key tile, 64)
    prefix_caching: bool = False  # paged: reuse cached blocks of a prompt's prefix
    kv_dtype: str = "auto"  # auto (the compute dtype) | fp32 | bf16 | fp16 | int8 | fp8
    step_factor: float = 0.0  # > 0: max_batched_tokens chosen at start so a step costs <= this many decode steps

    def validate(self, gamma: int = 0) -> "BatchSettings":
        for name in ("max_seqs", "max_model_len", "max_batched_tokens", "prefill_chunk"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"{name} {v!r} is not a positive whole number", f"set {name} to 1 or more")
        if not isinstance(self.max_waiting, int) or self.max_waiting < 0:
            raise UserError(f"max_waiting {self.max_waiting!r} is negative", "set max_waiting to 0 or more")
        if self.policy not in POLICIES:
            raise UserError(f"unknown scheduling policy '{self.policy}'", f"use one of: {', '.join(POLICIES)}")
        if self.kv_cache not in KV_CACHES:
            raise UserError(f"unknown KV cache '{self.kv_cache}'", f"use one of: {', '.join(KV_CACHES)}")
        if self.kv_cache == "slots" and (self.prefix_caching or self.kv_cache_gib or self.kv_dtype != "auto"):
            raise UserError("prefix caching, a KV budget and a KV dtype need the paged KV cache",
                            "set kv_cache to paged (serve: --kv-cache paged)")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 64 \
                or self.block_size % 64:
            raise UserError(f"block_size {self.block_size!r} is not a multiple of 64",
                            "use 64, 128, 256 ... (the fused attention reads keys in tiles of 64)")
        if not isinstance(self.kv_cache_gib, (int, float)) or isinstance(self.kv_cache_gib, bool) \
                or not 0 <= self.kv_cache_gib < 4096:
            raise UserError(f"kv_cache_gib {self.kv_cache_gib!r} is out of range", "give 0 (auto) or a budget in GiB")
        if isinstance(self.step_factor, bool) or not isinstance(self.step_factor, (int, float)) \
                or not (self.step_factor == 0 or 1 < self.step_factor <= 100):
            raise UserError(f"step_factor {self.step_factor!r} is out of range",
                            "give 0 (the budget as set) or a factor above 1 (e.g. 3: a step with prompt rows costs "
                            "at most 3 decode steps)")
        chunk = min(self.prefill_chunk, self.max_model_len)
        need = self.max_seqs * (gamma + 1) + chunk
        if self.max_batched_tokens < need:
            raise UserError(f"max_batched_tokens {self.max_batched_tokens} is smaller than a decode round of "
                            f"{self.max_seqs} sequences (gamma {gamma}: {self.max_seqs * (gamma + 1)} rows) plus "
                            f"one prefill chunk of {chunk}",
                            f"raise max_batched_tokens to at least {need}, or lower max_seqs or prefill_chunk")
        return self

    def step_rows(self, gamma: int = 0) -> int:
        """The most rows one sequence runs in a step: a prefill chunk, or a decode round (its last token and
        gamma drafts)."""
        return max(self.prefill_chunk, 1 + gamma)

    def to_dict(self) -> dict:
        return asdict(self)


def speculation_headroom(proposer_spec, gamma: int) -> int:
    """KV positions past a sequence's tokens that speculation writes: the setup's (EngineSetup.headroom)."""
    return EngineSetup(draft=proposer_spec.kind, gamma=gamma).headroom if proposer_spec is not None else 0


class Scheduler:
    """Queues, slots and steps. submit() and cancel() may be called from other threads than step()."""

    def __init__(self, target, settings: BatchSettings, proposer_spec=None, gamma: int = 0, adaptive: bool = False,
                 eos: set[int] | None = None, spec_policy: str = "fixed"):
        from engine.common.step_model import StepCost
        from engine.infer.spec_policy import SpecPolicy
        from engine.infer.paged import window_reach
        from engine.infer.tokens import eos_ids

        self.settings = settings.validate(gamma if proposer_spec else 0)
        self.headroom = speculation_headroom(proposer_spec, gamma)
        # the keys a sequence's next step can read start `reach` positions back: blocks before go back (every
        # layer's, or the windowed layers' pool beside full layers)
        self.reach = window_reach(target.model.cfg, second_pool=True) if settings.kv_cache == "paged" else 0
        self.step_rows = settings.step_rows(gamma if proposer_spec else 0)
        cache = self._paged_cache(target) if settings.kv_cache == "paged" else None
        self.blocks = cache.blocks if cache is not None else None
        proposer = proposer_spec.build(settings.max_seqs, settings.max_model_len) if proposer_spec else None
        self.batch = Batch(target, settings.max_seqs, settings.max_model_len,
                           eos if eos is not None else eos_ids(target), proposer, gamma, adaptive, cache)
        self.waiting: deque[Request] = deque()
        self.preempted: deque[Sequence] = deque()  # oldest first: admitted again before any waiting request
        self.preemptions = 0
        self.running: list[Sequence] = []
        self.free_slots = list(range(settings.max_seqs))[::-1]
        self.lock = threading.Lock()
        self._cancel: set[int] = set()  # Request.uid of cancelled running requests
        self._seq_of: dict[int, Sequence] = {}  # Request.uid -> its running sequence
        self.step_s_ewma = 0.05  # recent step time, for Retry-After
        self.shared_prompt_tokens = 0  # prompt positions copied from another choice, not prefilled
        # Each step's draft length (engine/infer/spec_policy.py); adaptive measures its step-cost model in prepare().
        self.policy = SpecPolicy(spec_policy, gamma, StepCost({}, {}) if spec_policy == "adaptive" else None) \
            if proposer is not None else None
        self.step_budget = None  # what prepare() measured and chose, under step_factor (engine/infer/step_budget.py)
        if self.settings.policy == "decode-first":  # every row of a step writes a cached position
            kv = self.batch.cache.num_blocks * self.batch.cache.block_size if self.batch.cache.paged \
                else settings.max_seqs * settings.max_model_len
            prompt = settings.max_batched_tokens - settings.max_seqs * (1 + (gamma if proposer_spec else 0))
            if prompt > kv:
                raise UserError(f"max_batched_tokens {settings.max_batched_tokens} leaves {prompt} prompt rows a "
                                f"step, more than the KV cache holds ({kv} positions)",
                                f"lower max_batched_tokens by at least {prompt - kv}, or raise the KV budget "
                                "(kv_cache_gib, max_model_len)")

    def prepare(self) -> None:
        """Before the first request: an adaptive policy's step-cost model and, under step_factor, the step's
        token budget, measured on this step path."""
        from engine.infer.spec_policy import profile

        if self.policy is not None and self.policy.cost is not None and not self.policy.cost.target_s:
            self.policy.cost = profile(self)
        if self.settings.step_factor and self.step_budget is None and self.settings.max_seqs > 1:
            from dataclasses import replace

            from engine.infer.step_budget import as_cost, profile as budget_profile

            sb = self.step_budget = budget_profile(self, self.settings.step_factor)
            self.settings = replace(self.settings, max_batched_tokens=sb.max_batched_tokens,
                                    prefill_chunk=sb.prefill_chunk)
            if self.policy is not None and self.policy.cost is not None:  # one step-cost model: the policy's
                for rows, t in as_cost(sb.decode_seqs, sb.decode_s, sb.with_rows_s).target_s.items():
                    self.policy.cost.target_s.setdefault(rows, t)  # table learns the larger steps it did not time

    def forget(self) -> None:
        """Empty and as built again (after the profile): no cached prefix, counters at zero."""
        assert not self.has_work(), "forget() with requests in flight"
        if self.blocks is not None:
            self.blocks.reset()
        self.preemptions = self.shared_prompt_tokens = 0
        self.step_s_ewma = 0.05

    def _paged_cache(self, target):
        from engine.infer.paged import PagedKVCache, blocks_in_budget, check_kv_dtype, held_blocks, sequence_bytes

        st, cfg = self.settings, target.model.cfg
        check_kv_dtype(st.kv_dtype, target.device)
        name = kv_dtype_name(st.kv_dtype, target.model.compute_dtype)
        # windowed layers beside full ones keep blocks in a pool of their own (window_sequence_blocks > 0)
        one, self.window_sequence_blocks = held_blocks(cfg, st.max_model_len, st.block_size, self.reach,
                                                       self.step_rows)
        self.sequence_blocks = one
        gib = st.kv_cache_gib or \
            st.max_seqs * sequence_bytes(cfg, st.block_size, name, one, self.window_sequence_blocks) / 2 ** 30
        n, wn = blocks_in_budget(cfg, st.block_size, name, gib, st.max_model_len, one, self.window_sequence_blocks)
        return PagedKVCache(cfg, st.max_seqs, st.max_model_len, n, st.block_size, target.model.compute_dtype,
                            target.device, st.kv_dtype, st.prefix_caching, window_blocks=wn)

    def kv_facts(self) -> dict:
        """What the KV cache is and holds: recorded beside the settings (and /metrics' gauges)."""
        c = self.batch.cache
        out = {"kv_cache": "paged" if c.paged else "slots", "kv_bytes": self.batch.kv_bytes(),
               "preemptions": self.preemptions, "kv_dtype": c.kv_name if c.paged else kv_dtype_name("auto", c.k.dtype)}
        if c.paged:
            b = self.blocks
            out.update(block_size=c.block_size, num_blocks=c.num_blocks, blocks_used=b.used(), blocks_peak=b.peak,
                       kv_window=self.reach, sequence_blocks=self.sequence_blocks,
                       prefix_caching=b.prefix_caching, prefix_cache_queries=b.stats.queries,
                       prefix_cache_hits=b.stats.hits, prefix_cache_evictions=b.evictions)
            if c.two_pools:  # the windowed layers' own blocks (the fields above: the full layers')
                w = b.window
                out.update(window_layers=len(c.pool_of) - c.k.shape[0], window_blocks=c.window_blocks,
                           window_blocks_used=w.used(), window_blocks_peak=w.peak,
                           window_sequence_blocks=self.window_sequence_blocks)
        return out

    # ------------------------------------------------------------ requests in

    def check(self, req: Request) -> None:
        """Refuse a request that can never fit a slot (the caller turns it into a 400)."""
        if not req.prompt_ids:
            raise UserError("the prompt is empty", "send at least one token")
        if req.max_new_tokens < (0 if req.prompt_logprobs is not None else 1):  # 0: the prompt's logprobs only
            raise UserError(f"max_tokens is {req.max_new_tokens}", "ask for at least 1 new token")
        total = len(req.prompt_ids) + req.max_new_tokens + self.headroom
        if total > self.settings.max_model_len:
            fit = self.settings.max_model_len - len(req.prompt_ids) - self.headroom
            raise UserError(f"prompt ({len(req.prompt_ids)} tokens) plus max_tokens {req.max_new_tokens} is {total} "
                            f"positions, beyond this server's max_model_len of {self.settings.max_model_len}",
                            f"ask for at most {fit} new tokens" if fit >= 1 else
                            f"shorten the prompt to under {self.settings.max_model_len - self.headroom} tokens")

    def submit(self, req: Request) -> Request:
        self.check(req)
        with self.lock:
            # Requests waiting beyond the free slots are the queue; admission happens at the next step.
            if len(self.waiting) >= len(self.free_slots) + self.settings.max_waiting:
                raise QueueFull(self.retry_after_s())
            self.waiting.append(req)
        return req

    def cancel(self, req: Request) -> bool:
        """Stop a request; its slot is free for the next step's admission. True when it was still waiting
        (gone now: no step will report it); a request that already finished is left alone."""
        with self.lock:
            for i, r in enumerate(self.waiting):
                if r is req:  # by identity: two requests with equal fields are still two requests
                    del self.waiting[i]
                    return True
            if req.uid in self._seq_of:
                self._cancel.add(req.uid)
            return False

    def retry_after_s(self) -> float:
        """A guess at when a slot frees: the shortest remaining budget among running sequences, in steps."""
        left = min((s.room for s in self.running), default=1)
        return max(1.0, left * self.step_s_ewma)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.preempted)

    def sequence(self, req: Request) -> Sequence | None:
        return self._seq_of.get(req.uid)

    # ------------------------------------------------------------ one step

    def _admit_paged(self) -> None:
        """Preempted sequences, then waiting requests, first come first served, while slots and the blocks of
        their prompts (or committed tokens) are there; the prefix cache supplies what it holds."""
        with self.lock:
            while self.preempted and self.free_slots:
                s = self.preempted[0]
                slot = self.free_slots[-1]
                reuse = s.recompute_to or (0 if s.req.prompt_logprobs is not None else s.n_prompt - 1)
                got = self.blocks.admit(slot, s.tokens, s.prefill_end, reuse, self._first_chunk)
                if got is None:
                    return
                self.preempted.popleft()
                self.free_slots.pop()
                s.slot, s.prefilled = slot, got
                self.batch.cache.sync(slot)
                self.running.append(s)
            while self.waiting and self.free_slots:
                req = self.waiting[0]
                slot = self.free_slots[-1]
                # at least the prompt's last token is prefilled (its logits give the first token); prompt
                # logprobs and an n-choice follower (which shares its leader's blocks) reuse nothing
                reuse = (0 if (req.prompt_logprobs is not None or req.prefix_from is not None)
                         else len(req.prompt_ids) - 1)
                got = self.blocks.admit(slot, list(req.prompt_ids), len(req.prompt_ids), reuse, self._first_chunk)
                if got is None:
                    return
                self.waiting.popleft()
                self.free_slots.pop()
                self.batch.cache.sync(slot)
                self._start(req, slot).prefilled = got

    def _first_chunk(self, reused: int, end: int) -> int:
        """The positions a sequence takes blocks for when admitted with `reused` positions cached: its whole
        prefill (to `end`), or with every layer windowed only its first chunk (more as it comes: _reserve)."""
        if not self.reach:
            return end
        c = self.settings.prefill_chunk
        return min(end, (reused // c + 1) * c)

    def _next_end(self, s: Sequence) -> int | None:
        """The positions s's blocks must cover for its next step: its round (last token and drafts) when
        decoding; with every layer windowed, the end of its next prefill chunk; else None (it holds them)."""
        if s.decoding:
            return len(s.tokens) + max(0, min(s.gamma, s.room - 1))
        return self._first_chunk(s.prefilled, s.prefill_end) if self.reach and s.finish is None else None

    def _start(self, req: Request, slot: int) -> Sequence:
        try:  # e.g. a seed the generator refuses: this request's failure, not the step's
            seq = self.batch.new_sequence(req, slot)
        except Exception as e:  # noqa: BLE001
            seq = Sequence(req, slot, self.batch.vocab, list(req.prompt_ids), len(req.prompt_ids))
            fail(seq, e)
        self.running.append(seq)
        self._seq_of[req.uid] = seq
        return seq

    def _admit(self) -> None:
        if self.blocks is not None:
            return self._admit_paged()
        with self.lock:
            while self.waiting and self.free_slots:
                self._start(self.waiting.popleft(), self.free_slots.pop())

    def _retire(self) -> list[Sequence]:
        with self.lock:
            for s in self.running + list(self.preempted):
                if s.req.uid in self._cancel and s.finish is None:
                    s.finish = "cancelled"
            done = [s for s in self.running if s.finish is not None]
            for s in done:
                self.running.remove(s)
                self._release(s)
            gone = [s for s in self.preempted if s.finish is not None]  # cancelled while preempted: no slot
            for s in gone:
                self.preempted.remove(s)
            for s in done + gone:
                self._cancel.discard(s.req.uid)
                self._seq_of.pop(s.req.uid, None)
        return done + gone

    def _release(self, s: Sequence) -> None:
        self.batch.free(s)
        if self.blocks is not None:
            self.blocks.release(s.slot)
        self.free_slots.append(s.slot)

    def _preempt(self, s: Sequence) -> None:
        """Give s's blocks back; it waits (before any new request) and prefills its committed tokens again."""
        with self.lock:
            self.running.remove(s)
            self._release(s)
            s.prefilled, s.recompute_to = 0, (len(s.tokens) - 1 if s.out else 0)
            if not s.out:  # its prompt's logprobs are collected again from the start
                s.prompt_logprobs = []
            self.preempted.appendleft(s)  # preempted newest first, so the oldest ends up first
            self.preemptions += 1

    def _reserve(self) -> None:
        """Blocks for every decoding sequence's next round (its last token and drafts), and with every layer
        windowed every prefilling one's next chunk, oldest first; when they run out, the newest sequence is
        preempted (possibly the one asking)."""
        for s in sorted(self.running, key=_arrival):
            need = self._next_end(s) if s in self.running else None
            if need is None:
                continue
            held = self.blocks.entries(s.slot)
            while not self.blocks.grow(s.slot, need):
                victim = max(self.running, key=_arrival)
                self._preempt(victim)
                if victim is s:
                    break
            if s in self.running and self.blocks.entries(s.slot) != held:  # the kernels read the new blocks
                self.batch.cache.sync(s.slot)

    def plan(self) -> tuple[list[Sequence], list[tuple[Sequence, int]]]:
        st = self.settings
        decode = [s for s in self.running if s.decoding]
        prefilling = [s for s in self.running if not s.decoding and s.finish is None]
        if st.policy == "prefill-first" and prefilling:
            decode = []
        budget = st.max_batched_tokens - sum(1 + max(0, min(s.gamma, s.room - 1)) for s in decode)
        chunks = []
        prefilling = [s for s in prefilling if self._share_prefix(s)]
        for s in prefilling:  # oldest first; a chunk that does not fit waits, and so do the younger ones
            pos, fits = s.prefilled, True
            while pos < s.prefill_end:
                # whole chunks at fixed boundaries: chunk k covers [k*c, (k+1)*c)
                n = min(st.prefill_chunk - pos % st.prefill_chunk, s.prefill_end - pos)
                if n > budget:
                    fits = False
                    break
                chunks.append((s, n))
                budget, pos = budget - n, pos + n
                if st.policy == "decode-first" or self.reach:
                    break  # one chunk per sequence per step (a window's blocks are taken chunk by chunk)
            if not fits:
                break
        return decode, chunks

    def _share_prefix(self, s: Sequence) -> bool:
        """False while s waits for the choice whose prompt K/V it will copy. It copies every whole chunk
        before the prompt's last one (fixed boundaries: the last chunk it prefills itself is the same
        forward its leader ran). A leader cancelled or failed first, or a prompt of one chunk: s prefills
        alone."""
        lead_req = s.req.prefix_from
        if lead_req is None or s.prefilled:
            return True
        n = (s.n_prompt - 1) // self.settings.prefill_chunk * self.settings.prefill_chunk
        lead = self._seq_of.get(lead_req.uid)
        if n == 0 or lead is None or lead.finish in ("cancelled", "error"):
            s.req.prefix_from = None
            return True
        if lead.prefilled < n:
            return False
        n = self.batch.share_prefix(lead, s, n)
        s.req.prefix_from = None
        with self.lock:
            self.shared_prompt_tokens += n
        if n and self.reach:  # admitted with its first chunk's blocks: those of the chunk after the shared ones
            grown = self.blocks.grow(s.slot, self._first_chunk(n, s.prefill_end))
            self.batch.cache.sync(s.slot)
            return grown  # none left: it waits for the next step's _reserve
        return True

    def step(self) -> tuple[StepStats | None, list[Sequence]]:
        """Admit, run one step, retire; returns the step's stats (None if nothing ran) and the finished."""
        done = self._retire()
        self._admit()
        if self.policy is not None:  # this step's draft length, before blocks are reserved for it
            owed = getattr(self.batch.proposer, "owed", None)  # lookup drafts keep no cache: they owe nothing
            g = self.policy.choose(sum(1 for s in self.running if s.decoding),
                                   sum(owed(s) for s in self.running) if owed else 0,
                                   sum(s.room for s in self.running), len(self.running))
            if g is not None:
                for s in self.running:
                    s.gamma = g
                self.batch.draft_prefill = g > 0
        if self.blocks is not None:
            self._reserve()
        decode, chunks = self.plan()
        if not decode and not chunks:
            return None, done + self._retire()
        # A chunk list may name a sequence more than once (prefill-first): the batch runs them in order.
        st = self._run(decode, chunks)
        if self.policy is not None:
            self.policy.observe(st)
        for s in self.running:
            try:  # detokenizing and the request's callback are that request's own
                stream(s)
            except Exception as e:  # noqa: BLE001
                fail(s, e)
        self.step_s_ewma = 0.8 * self.step_s_ewma + 0.2 * st.wall_s
        if self.blocks is not None:  # blocks now full of committed K/V join the prefix cache
            for s in self.running:
                self.blocks.register(s.slot, s.tokens, s.cached_len)
                # then those behind the window go back: the next step's first key is cached_len - reach + 1
                if self.reach and self.blocks.trim(s.slot, s.cached_len - self.reach + 1):
                    self.batch.cache.sync(s.slot)
        return st, done + self._retire()

    def _run(self, decode, chunks) -> StepStats:
        merged: dict[int, list] = {}
        order = []
        for s, n in chunks:  # consecutive chunks of one sequence run as one segment
            if id(s) in merged:
                merged[id(s)][1] += n
            else:
                merged[id(s)] = [s, n]
                order.append(id(s))
        return self.batch.step(decode, [tuple(merged[k]) for k in order])

    def run_until_done(self, on_step=None) -> None:
        """Step until every submitted request has finished (static batches, tests)."""
        while self.has_work():
            st, _ = self.step()
            if on_step is not None and st is not None:
                on_step(st)
            if st is None and not self.running and self.waiting:
                time.sleep(0)  # nothing admissible yet
