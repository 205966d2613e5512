"""`python -m engine serve`: our engine behind an OpenAI-compatible HTTP server on 127.0.0.1."""
from __future__ import annotations

import argparse
import logging
import sys

from engine.common.errors import UserError

DEFAULT_PORT = 8000
STEP_FACTOR = 2.5  # ITL p99 <= 3x p50 at concurrency 8 on the 0.5B and the 1.5B (docs/BENCHMARKS.md, session 25)
DEATH_GRACE_S = 2.0  # after the engine dies: in-flight requests get their errors, /health says 503, then exit 1
KV_FACTS = ("kv_cache", "kv_dtype", "block_size", "num_blocks", "kv_bytes", "prefix_caching", "kv_window",
            "sequence_blocks", "window_layers", "window_blocks", "window_sequence_blocks")  # fixed at start


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API (continuous batching)")
    p.add_argument("--model", default="default", help="catalog name (default, default-draft), folder or hub id")
    p.add_argument("--precision", default="int4",
                   help="fp32, bf16, fp16, int8, int4, llm.int8, nf4, fp8; int4 may name its method "
                        "and group: int4-gptq, int4-awq-g32, int4-gptq-mixed (int4 alone is round-to-nearest)")
    p.add_argument("--group-size", type=int, default=64, help="int4 group size: 32, 64 or 128")
    p.add_argument("--quantize-embeddings", action="store_true", help="also quantize the embedding table")
    p.add_argument("--no-quantize-head", action="store_true", help="keep the output head in float")
    p.add_argument("--draft", default="none", help="none, model, self, ngram or suffix")
    p.add_argument("--draft-model", default="default-draft")
    p.add_argument("--draft-precision", default="int4")
    p.add_argument("--gamma", type=int, default=4, help="draft tokens per round (the most, under --spec-policy "
                   "adaptive)")
    p.add_argument("--spec-policy", default="adaptive",
                   help="each step's draft length: adaptive (0 to --gamma, the most tokens per second by a step-cost "
                        "model measured at start and the running acceptance), fixed (always --gamma), off (no draft)")
    p.add_argument("--per-request-spec-decode-metrics", default="off", choices=("off", "summary"),
                   help="vLLM's: each response carries its speculative stats in metrics.speculative_decoding "
                        "(zeros and policy 'off' when the server is not speculating)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback; 0.0.0.0 serves the LAN)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--served-model-name", default=None, help="the model id clients ask for (default: --model)")
    p.add_argument("--max-seqs", type=int, default=8, help="sequences decoding together (KV cache slots)")
    p.add_argument("--max-model-len", type=int, default=2048, help="positions per sequence: prompt + new tokens")
    p.add_argument("--max-batched-tokens", type=int, default=None,
                   help="rows one step may run: a decode round of every slot plus the prompt rows a step may carry "
                        "(default: chosen at start by --max-step-factor)")
    p.add_argument("--max-step-factor", type=float, default=STEP_FACTOR,
                   help="a step carrying prompt rows costs at most this many decode steps of every slot: the server "
                        "times its steps at start and sets --max-batched-tokens from them (0: a decode round plus "
                        "one prefill chunk, the budget before this option; docs/SERVING.md)")
    p.add_argument("--prefill-chunk", type=int, default=64,
                   help="prompt tokens per prefill chunk: it bounds how long a decode step waits for a prefill "
                        "(ITL p99 710 ms at 256, 335 ms at 64: docs/SERVING.md)")
    p.add_argument("--max-waiting", type=int, default=64, help="queued requests beyond the running ones (then 429)")
    p.add_argument("--kv-cache", default="paged", choices=("paged", "slots"),
                   help="paged: blocks taken as sequences grow, in --kv-cache-gib (docs/SERVING.md); slots: "
                        "max-model-len positions reserved per sequence up front")
    p.add_argument("--kv-cache-gib", type=float, default=0.0,
                   help="the paged cache's budget in GiB (0: what --max-seqs sequences of --max-model-len hold; a "
                        "model whose every layer is windowed holds its window and one chunk per sequence)")
    p.add_argument("--block-size", type=int, default=64, help="positions per KV block (a multiple of 64)")
    p.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="automatic prefix caching (paged cache; on by default): --no-prefix-caching for "
                        "like-for-like comparisons with servers that have none")
    p.add_argument("--kv-dtype", default="auto",
                   help="the KV cache's precision: auto (the compute dtype), int8, fp8 (GPU)")
    p.add_argument("--max-tokens-default", type=int, default=256, help="max_tokens when a request gives none")
    p.add_argument("--log-requests-text", action="store_true", help="also log prompts' outputs (off: no text logged)")
    p.set_defaults(fn=run)
    return p


def setup_from(a):
    """The engine setup the arguments ask for (validated: a bad one is refused before anything loads)."""
    from engine.common.setup import EngineSetup

    return EngineSetup(model=a.model, precision=a.precision, group_size=a.group_size,
                       quantize_embeddings=a.quantize_embeddings, quantize_head=not a.no_quantize_head,
                       device=a.device, draft=a.draft, draft_model=a.draft_model, draft_precision=a.draft_precision,
                       gamma=a.gamma, spec_policy=a.spec_policy).validate()


def build(a):
    """Load the setup (target, draft, proposer) and the engine loop; returns (loop, served name, facts)."""
    from engine.infer.loader import load_setup
    from engine.infer.scheduler import BatchSettings
    from engine.serve.loop import EngineLoop

    setup = setup_from(a)
    gamma = setup.gamma if setup.speculative else 0
    chunk = a.prefill_chunk
    # A decode round of every slot (each verifying its drafts) plus one prefill chunk, until the step factor's
    # profile (loop.start()) chooses the prompt rows; a budget given is kept as given.
    batched = a.max_batched_tokens or min(a.max_seqs * max(setup.headroom, 1) + chunk, a.max_seqs * a.max_model_len)
    factor = 0.0 if a.max_batched_tokens else a.max_step_factor
    paged = a.kv_cache == "paged"
    settings = BatchSettings(max_seqs=a.max_seqs, max_model_len=a.max_model_len, max_batched_tokens=batched,
                             prefill_chunk=chunk, max_waiting=a.max_waiting, policy="decode-first",
                             kv_cache=a.kv_cache, kv_cache_gib=a.kv_cache_gib, block_size=a.block_size,
                             prefix_caching=paged and a.prefix_caching, kv_dtype=a.kv_dtype,
                             step_factor=factor).validate(gamma)  # before the weights load: a bad one is refused now
    say = lambda s: print(f"[{s}]", file=sys.stderr, flush=True)  # noqa: E731
    loaded = load_setup(setup, progress=say)
    target = loaded.target
    loop = EngineLoop(target, settings, loaded.proposer, gamma, log_text=a.log_requests_text,
                      spec_policy=setup.spec_policy)
    loop.per_request_spec = a.per_request_spec_decode_metrics
    facts = {"model": target.name, "precision": target.spec.label, "device": target.device,
             "draft": setup.to_record()["draft"], "setup": setup.to_dict(), "settings": settings.to_dict(),
             "kv": {k: v for k, v in loop.scheduler.kv_facts().items() if k in KV_FACTS},
             "calibration": target.calibration}
    return loop, a.served_model_name or a.model, facts


def run(a) -> int:
    try:
        import uvicorn

        from engine.serve.app import create_app
    except ImportError as e:  # a checkout installed before the server's dependencies were
        raise UserError(f"the server's HTTP stack is missing ({e.name} not installed)",
                        "pip install -e . (fastapi and uvicorn are dependencies)") from e

    if not 1 <= a.port <= 65535:
        raise UserError(f"port {a.port} is out of range", "use 1 to 65535")
    if a.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"WARNING: serving on {a.host}: anyone who can reach this machine can send requests to this model.",
              file=sys.stderr, flush=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    from engine.common.threads import on_a_passing_thread

    loop, name, facts = on_a_passing_thread(build, a)  # the engine thread then holds the only OpenMP team
    loop.start()
    facts.update(started_facts(loop))
    app = create_app(loop, name, facts, a.max_tokens_default)

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            print(f"serving on http://{a.host}:{a.port}", flush=True)

    server = Server(uvicorn.Config(app, host=a.host, port=a.port, log_level="warning", lifespan="off",
                                   timeout_graceful_shutdown=5))
    stop_when_engine_dies(loop, server)
    try:
        server.run()
    finally:
        loop.stop()
    if loop.error is not None:  # a supervisor (systemd, Kubernetes) restarts us on a non-zero exit
        print(f"exiting: {loop.reason}", file=sys.stderr, flush=True)
        return 1
    return 0


def started_facts(loop) -> dict:
    """What the engine chose as it started: its settings (the step's token budget) and the budget's profile."""
    sb = loop.scheduler.step_budget
    return {"settings": loop.scheduler.settings.to_dict(), "step_budget": sb.to_dict() if sb is not None else None}


def stop_when_engine_dies(loop, server, grace_s: float = DEATH_GRACE_S) -> None:
    """The server does not restart a dead engine (its weights or cache may be what broke): it answers 503
    for grace_s, so in-flight requests get their errors and health checks see it, then shuts down."""
    import threading

    def on_death(_e):
        threading.Timer(grace_s, lambda: setattr(server, "should_exit", True)).start()

    loop.on_death = on_death
