"""The scheduler on its own thread: requests come in from the HTTP event loop, tokens go back as events.

The engine thread steps the scheduler while there is work and sleeps on a condition otherwise.
Each request gets an asyncio queue; the engine thread puts ("token", piece) events and one final
("done", info) or ("error", {"status", "message"}) event on it through the event loop's
call_soon_threadsafe. A request that asked for logprobs also gets ("prompt_logprobs", [entry or None per
prompt token]) before its first token, and ("logprob", TokenLogprob) right before each token's
("token", piece) event (a piece may be "" while text is held back; the entry still comes); text still held
at the end comes as one ("text", piece) event, which is no token. All of it goes
through call_soon_threadsafe, so the HTTP side never blocks the engine and the engine never waits for a slow
client. Cancelling (a client that disconnected) frees the request's slot at the next step boundary.

Failures: a request whose own work fails (its sampling, its detokenization) gets a 500 error event
and the others go on. If the loop itself dies (a forward pass raises), every request in flight gets
a 503 error event, submit() refuses new ones with EngineDead, and on_death is called once (the CLI
exits non-zero after a short grace; see docs/SERVING.md, "Failures").
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from engine.infer.batch import Request, fail
from engine.infer.scheduler import BatchSettings, QueueFull, Scheduler
from engine.serve.stats import ServerStats

log = logging.getLogger("scl.serve")
FINISH = {"eos": "stop", "length": "length", "cancelled": "abort", "error": "error"}


class EngineDead(Exception):
    """The engine loop has stopped: no request can be served (the server answers 503)."""


@dataclass
class Handle:
    """One request in flight: its events, and its timings as the engine saw them."""

    req: Request
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    t_arrival: float = field(default_factory=time.perf_counter)
    t_admit: float | None = None
    log_text: bool = False
    label: str = ""
    sent_prompt: bool = False  # the prompt_logprobs event went out


    def put(self, ev) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, ev)


def _with_logprobs(h: Handle):
    """on_token for a request that wants logprobs. batch.stream() hands each kept token of seq.out to it
    once, in order, so the k-th call is seq.logprobs[k] (tokens dropped after a stop are never handed)."""
    k = 0

    def on_token(seq, tok, piece, origin):
        nonlocal k
        if seq.req.prompt_logprobs is not None and not h.sent_prompt:
            h.sent_prompt = True
            h.put(("prompt_logprobs", seq.prompt_logprobs))
        if seq.req.logprobs is not None:
            h.put(("logprob", seq.logprobs[k]))
        k += 1
        h.put(("token", piece))
    return on_token


class EngineLoop:
    """Owns the Scheduler; thread-safe submit/cancel, one background thread running steps."""

    def __init__(self, target, settings: BatchSettings, proposer_spec=None, gamma: int = 0, log_text: bool = False,
                 spec_policy: str = "fixed"):
        self.scheduler = Scheduler(target, settings, proposer_spec, gamma, spec_policy=spec_policy)
        self.settings = settings
        self.tokenizer = target.tokenizer
        self.stats = ServerStats(gamma=gamma if proposer_spec else 0)
        self.log_text = log_text
        self.per_request_spec = "off"  # vLLM's --per-request-spec-decode-metrics: off | summary
        self._handles: dict[int, Handle] = {}  # Request.uid -> handle
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="scl-engine", daemon=True)
        self.error: BaseException | None = None
        self.on_death: Callable[[BaseException], None] | None = None  # called once, on the engine thread
        self._ready = threading.Event()

    def start(self) -> "EngineLoop":
        """Start the engine thread; returns once it is ready to serve (an adaptive policy has measured its
        step costs), or raises what stopped it."""
        self._thread.start()
        self._ready.wait()
        if self.error is not None:
            raise self.error
        return self

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    @property
    def reason(self) -> str:
        """Why the engine cannot serve (empty while it can)."""
        if self.error is not None:
            return f"the engine stopped: {type(self.error).__name__}: {self.error}"
        if self._stop:
            return "the server is shutting down"
        return "" if self._thread.is_alive() else "the engine is not running"

    # ------------------------------------------------------------ from the event loop

    def submit(self, req: Request, label: str = "") -> Handle:
        """Queue a request (UserError if it can never fit, QueueFull when at capacity, EngineDead when the
        engine has stopped). The handle is registered before the engine thread can see the request."""
        h = Handle(req, asyncio.Queue(), asyncio.get_running_loop(), label=label)
        if req.logprobs is None and req.prompt_logprobs is None:
            req.on_token = lambda seq, tok, piece, origin: h.put(("token", piece))
        else:
            req.on_token = _with_logprobs(h)
        with self._cv:
            if self.reason:
                raise EngineDead(self.reason)
            self._handles[req.uid] = h  # a death from here on reaches this handle
        try:
            self.scheduler.submit(req)
        except BaseException as e:
            with self._cv:
                self._handles.pop(req.uid, None)
            if isinstance(e, QueueFull):
                with self.stats.lock:
                    self.stats.rejected += 1
            raise
        with self._cv:
            self._cv.notify()
        return h

    def cancel(self, h: Handle) -> None:
        with self._cv:
            if h.req.uid not in self._handles:  # finished already: nothing to cancel
                return
            if self.scheduler.cancel(h.req):  # still waiting: gone now, no step will report it
                self._handles.pop(h.req.uid, None)
                self.stats.request_done(None, "abort", h.t_arrival, None, time.perf_counter())
                h.put(("done", {"finish_reason": "abort", "completion_tokens": 0,
                                "prompt_tokens": len(h.req.prompt_ids)}))
            self._cv.notify()

    def gauges(self) -> dict:
        s = self.scheduler
        return {"running": len(s.running), "waiting": len(s.waiting) + len(s.preempted),
                "slots_used": len(s.running), "slots": self.settings.max_seqs, "kv": s.kv_facts(),
                "spec": s.policy.facts() if s.policy is not None else None}

    # ------------------------------------------------------------ the engine thread

    def _run(self) -> None:
        try:
            self.scheduler.prepare()  # on this thread: its OpenMP team is the one that serves
        except BaseException as e:  # noqa: BLE001  start() raises it
            self.error = e
            return
        finally:
            self._ready.set()
        try:
            while True:
                with self._cv:
                    while not self._stop and not self.scheduler.has_work():
                        self._cv.wait(timeout=1.0)
                    if self._stop:
                        return
                st, done = self.scheduler.step()
                now = time.perf_counter()
                for seq in self.scheduler.running:
                    h = self._handles.get(seq.req.uid)
                    if h is not None and h.t_admit is None:
                        h.t_admit = seq.t_admit
                for seq in done:
                    self._finish(seq, now)
                if st is None and not done:
                    time.sleep(0.001)
        except BaseException as e:  # noqa: BLE001  the server reports it on /health and fails requests
            log.exception("engine loop stopped")
            with self._cv:
                self.error = e
                for h in self._handles.values():
                    h.put(("error", {"status": 503, "message": self.reason}))
                self._handles.clear()
            if self.on_death is not None:
                self.on_death(e)

    def _finish(self, seq, now: float) -> None:
        with self._cv:
            h = self._handles.pop(seq.req.uid, None)
        if h is None:
            return
        tail = ""
        if seq.finish != "error" and seq.stream is not None:
            try:  # the last held text: this request's own detokenizing, so its failure is the request's
                tail = seq.stream.flush()
            except Exception as e:  # noqa: BLE001
                fail(seq, e)
        reason = FINISH.get(seq.finish, "stop")
        self.stats.request_done(seq, reason, h.t_arrival, h.t_admit or seq.t_admit, now)
        if seq.finish == "error":
            e = seq.error
            log.error(f"request {h.label or seq.req.uid} failed in the engine", exc_info=e)
            h.put(("error", {"status": 500, "message": f"this request failed in the engine: {type(e).__name__}: {e}"}))
            return
        info = {"finish_reason": reason, "prompt_tokens": seq.n_prompt, "completion_tokens": len(seq.out),
                "ttft_s": None if seq.t_first is None else seq.t_first - h.t_arrival, "e2e_s": now - h.t_arrival,
                "accepted": seq.spec_stats.accepted, "drafted": seq.spec_stats.drafted,
                "spec_rounds": seq.spec_stats.rounds, "accepted_hist": list(seq.spec_stats.accepted_hist)}
        if seq.req.prompt_logprobs is not None and not h.sent_prompt:  # max_tokens 0: no token came
            h.put(("prompt_logprobs", seq.prompt_logprobs))
        if tail:  # held text released at the end: text without a token of its own
            h.put(("text", tail))
        h.put(("done", info))
        msg = (f"request {h.label or seq.req.uid}: prompt {seq.n_prompt} tokens, {len(seq.out)} generated, "
               f"finish {reason}, ttft {info['ttft_s'] or 0:.3f} s, e2e {info['e2e_s']:.3f} s")
        if self.log_text:
            msg += f", text {self.tokenizer.decode(seq.out, skip_special_tokens=True)!r}"
        log.info(msg)
