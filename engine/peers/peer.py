"""One peer measurement: its config, whether it can run here, and measuring it in a fresh subprocess.

Every system gets the same prompt token ids, the same number of new tokens (EOS is ignored, so all
emit exactly N), greedy decoding, one warm-up, then `reps` timed repetitions; the medians are kept.
Each measurement runs in a fresh subprocess, so peak memory is that system's alone and no library
state (thread pools, caches, mmaps) leaks from one system into the next.

Definitions, the same for every system (timestamps are taken as each new token reaches Python):
- ttft_s: from the call to the first new token.
- decode_tok_s: (N - 1) / (time of the last token - time of the first token).
- token_latency_ms_mean: the mean gap between consecutive tokens; token_gap_ms_p90: the 90th
  percentile gap (drafted tokens arrive together, so gaps inside a batch are ~0).
- peak_rss_bytes: the process's peak resident memory while generating (sampled);
  load_peak_rss_bytes: the process's lifetime peak (ru_maxrss), loading included.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, fields

from engine.common.errors import UserError
from engine.common.paths import REPO_ROOT
from engine.common.vocab import BNB_PRECISIONS, parse_precision

SYSTEMS = ("serving-cost-lab", "transformers", "llama.cpp")
OURS = "serving-cost-lab"
# Per system: the precisions and draft kinds it offers. "ngram" is prompt lookup in every system.
HF_PRECISIONS = ("fp32", "bf16", "fp16", "llm.int8", "nf4")  # the last two through bitsandbytes
LLAMA_PRECISIONS = ("Q4_K_M",)  # the catalog GGUF exactly as shipped
DRAFTS = {"transformers": ("none", "model", "ngram"), "llama.cpp": ("none", "ngram"),
          OURS: ("none", "model", "self", "ngram")}
RESULT_TAG = "SCL_PEER_RESULT "
# Peer defaults, as their docs suggest (recorded in each result).
HF_PROMPT_LOOKUP_TOKENS = 10
LLAMA_LOOKUP_TOKENS = 10


@dataclass
class PeerConfig:
    system: str = OURS
    model: str = "default"
    precision: str = "fp32"
    draft: str = "none"  # none | model | self | ngram
    draft_model: str = "default-draft"
    draft_precision: str = "int4"  # ours; transformers' assistant runs at the target's precision
    gamma: int = 4  # ours; transformers and llama.cpp use their own defaults (recorded)
    prompt: str | None = None  # None: the first of data/prompts.json
    prompt_ids: list[int] | None = None  # overrides prompt (random-init models have no useful tokenizer)
    max_new_tokens: int = 64
    reps: int = 3
    device: str = "cpu"
    random_init: str | None = None  # a data/models.json shape: random weights of that shape (GPU runs)
    act: str = "fp32"  # ours on CPU: "int8" quantizes int4 kernels' activations (SCL_KERNEL_ACT), as llama.cpp does
    timeout_s: int = 1800

    def measure(self, pool=None, store=None, progress=None):
        """Measure in a fresh process (the interface sweep.run_many calls; the pool is not used)."""
        return measure(self, store, progress)

    def __post_init__(self):
        # One vocabulary: "bnb-nf4", "bfloat16" and the like are accepted and stored canonically.
        if self.system != "llama.cpp" and isinstance(self.precision, str):
            try:
                self.precision = parse_precision(self.precision)
            except UserError:
                pass  # validate() names the choices

    def validate(self) -> "PeerConfig":
        if self.system not in SYSTEMS:
            raise UserError(f"unknown peer system '{self.system}'", f"use one of: {', '.join(SYSTEMS)}")
        if self.draft not in DRAFTS[self.system]:
            raise UserError(f"{self.system} has no '{self.draft}' draft",
                            f"use one of: {', '.join(DRAFTS[self.system])}")
        if self.system == "transformers" and self.precision not in HF_PRECISIONS:
            raise UserError(f"transformers peer has no precision '{self.precision}'",
                            f"use one of: {', '.join(HF_PRECISIONS)}")
        if self.system == "llama.cpp":
            if self.precision not in LLAMA_PRECISIONS:
                raise UserError(f"llama.cpp peer runs the catalog GGUF as shipped, not '{self.precision}'",
                                "use precision Q4_K_M")
        if self.random_init and (self.system == "llama.cpp" or self.draft == "model"):
            raise UserError(f"{self.label} cannot run on random weights: it needs a GGUF file or a trained draft",
                            "on random-init shapes use self or ngram drafts, and no llama.cpp")
        if self.act not in ("fp32", "int8") or (self.act == "int8" and self.system != OURS):
            raise UserError(f"activation mode '{self.act}' is not offered for {self.system}",
                            "use act='int8' only with serving-cost-lab (its int4 CPU kernels), else 'fp32'")
        if self.system == OURS:
            from engine.infer.loader import make_spec

            make_spec(self.precision)
            if self.draft in ("model", "self"):
                make_spec(self.draft_precision)
        if not isinstance(self.max_new_tokens, int) or not 2 <= self.max_new_tokens <= 4096:
            raise UserError(f"max_new_tokens {self.max_new_tokens} is out of range", "use 2 to 4096")
        if not isinstance(self.reps, int) or not 1 <= self.reps <= 50:
            raise UserError(f"reps {self.reps} is out of range", "use 1 to 50 repetitions")
        return self

    @property
    def label(self) -> str:
        s = f"{self.system} {self.precision}" + (" (bitsandbytes)" if self.precision in BNB_PRECISIONS else "") \
            + (" a8" if self.act == "int8" else "")
        if self.draft == "model":
            dp = self.draft_precision if self.system == OURS else self.precision
            s += f" + {self.draft_model}@{dp} draft" + (f" g={self.gamma}" if self.system == OURS else "")
        elif self.draft == "self":
            s += f" + self@{self.draft_precision} g={self.gamma}"
        elif self.draft == "ngram":
            s += " + prompt lookup" + (f" g={self.gamma}" if self.system == OURS else "")
        return s

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "PeerConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


# ---------------------------------------------------------------- availability

def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def unavailable_reason(cfg: PeerConfig) -> str | None:
    """Why this peer cannot run here (None when it can). Cheap: no model is loaded."""
    if cfg.system == "transformers":
        if not _has("transformers"):
            return "transformers is not installed (pip install transformers)"
        if cfg.precision in BNB_PRECISIONS and not _has("bitsandbytes"):
            return "bitsandbytes is not installed (pip install bitsandbytes)"
        if cfg.precision == "fp16" and cfg.device == "cpu":
            return "fp16 matmuls on CPU are emulated and not a configuration anyone serves; use bf16"
    if cfg.system == "llama.cpp" and not _has("llama_cpp"):
        return ("llama-cpp-python is not installed; `make peers` builds it from PyPI (about 8 minutes on 2 cores)")
    if cfg.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return "no CUDA GPU is visible to torch"
    return None


def measure(cfg: PeerConfig, store=None, progress=None):
    """Run one peer in a subprocess and return its RunRecord (kind "peer").

    An unavailable or failing peer still returns a record: metrics empty, notes saying why
    ("unavailable: ..." for a refusal or a missing package, "failed: ..." for a crash or a
    timeout). Only records with metrics are saved to `store`.
    """
    from engine.measure.records import RunRecord

    cfg.validate()
    say = progress or (lambda s: None)
    reason = unavailable_reason(cfg)
    result, status = None, "unavailable"
    if reason is None:
        say(f"measuring {cfg.label} ({cfg.reps} reps of {cfg.max_new_tokens} tokens, in a fresh process)")
        result, reason, status = _spawn(cfg)
    config = _record_config(cfg, result)
    rec = RunRecord(kind="peer", config=config, metrics=(result or {}).get("metrics", {}),
                    machine=(result or {}).get("machine") or _machine(cfg.device),
                    versions=(result or {}).get("versions") or {},
                    kernels=(result or {}).get("kernels") or {},
                    output=(result or {}).get("output") or {},
                    notes="" if reason is None else f"{status}: {reason}")
    if store is not None and reason is None:
        store.save_run(rec)
    return rec


def _record_config(cfg: PeerConfig, result: dict | None) -> dict:
    draft = None
    if cfg.draft != "none":
        draft = {"kind": cfg.draft, "model": cfg.draft_model if cfg.draft == "model" else None,
                 "precision": (cfg.draft_precision if cfg.system == OURS else cfg.precision)
                 if cfg.draft in ("model", "self") else None,
                 "gamma": cfg.gamma if cfg.system == OURS else None,
                 "setting": (result or {}).get("draft_setting")}
    return {"system": cfg.system, "label": cfg.label, "model": cfg.model, "precision": cfg.precision,
            "device": cfg.device, "batch_size": 1, "max_new_tokens": cfg.max_new_tokens, "draft": draft,
            "reps": cfg.reps, "random_init": cfg.random_init, "peer_config": cfg.to_dict()}


def _machine(device: str) -> dict:
    import torch

    from engine.measure.machine import machine_facts

    return machine_facts(device if device.startswith("cuda") and torch.cuda.is_available() else "cpu")


def _spawn(cfg: PeerConfig) -> tuple[dict | None, str | None, str]:
    """(result, None, "ok"), or (None, reason, "unavailable" | "failed")."""
    root = str(REPO_ROOT)
    env = dict(os.environ)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    if cfg.act == "int8":
        env["SCL_KERNEL_ACT"] = "int8"
    else:
        env.pop("SCL_KERNEL_ACT", None)
    try:
        p = subprocess.run([sys.executable, "-m", "engine.peers.workers"], input=json.dumps(cfg.to_dict()), text=True,
                           capture_output=True, timeout=cfg.timeout_s, env=env, cwd=root)
    except subprocess.TimeoutExpired:
        return (None, f"did not finish within {cfg.timeout_s} s (raise timeout_s, or lower max_new_tokens/reps)",
                "failed")
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            d = json.loads(line[len(RESULT_TAG):])
            if "error" in d:
                return None, d["error"], d.get("status", "failed")
            return d, None, "ok"
    tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
    return None, f"the worker exited with status {p.returncode}: {' | '.join(tail)[-400:]}", "failed"



def token_agreement(rec, ref) -> int | None:
    """How many leading new tokens `rec` shares with `ref` (None when either has no tokens)."""
    a = ((rec.output or {}).get("new_tokens") or [None])[0]
    b = ((ref.output or {}).get("new_tokens") or [None])[0]
    if not a or not b:
        return None
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


