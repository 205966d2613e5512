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
from dataclasses import asdict, dataclass, field, fields, replace

from engine.common.errors import UserError, read_object
from engine.common.paths import REPO_ROOT
from engine.common.setup import EngineSetup
from engine.common.vocab import BNB_PRECISIONS, parse_precision
from engine.peers import gguf_tools

SYSTEMS = ("serving-cost-lab", "transformers", "llama.cpp")
OURS = "serving-cost-lab"
# Per system: the precisions and draft kinds it offers. "ngram" is prompt lookup in every system.
HF_PRECISIONS = ("fp32", "bf16", "fp16", "llm.int8", "nf4")  # the last two through bitsandbytes
LLAMA_PRECISIONS = tuple(gguf_tools.LLAMA_PRECISIONS)  # the catalog GGUF as shipped, or llama.cpp's own quantization
DRAFTS = {"transformers": ("none", "model", "ngram"), "llama.cpp": ("none", "ngram"),
          OURS: ("none", "model", "self", "ngram", "suffix")}
RESULT_TAG = "SCL_PEER_RESULT "
# Peer defaults, as their docs suggest (recorded in each result).
HF_PROMPT_LOOKUP_TOKENS = 10
LLAMA_LOOKUP_TOKENS = 10


def _default_setup() -> EngineSetup:
    return EngineSetup(device="cpu")


@dataclass
class PeerConfig:
    """One system measured the same way as every other. `setup` is the engine setup: all of it for ours;
    for a peer its model, precision (in that system's vocabulary: Q4_K_M for llama.cpp), device, draft
    kind and draft model (transformers' assistant runs at the target's precision, with its own gamma)."""

    system: str = OURS
    setup: EngineSetup = field(default_factory=_default_setup)
    prompt: str | None = None  # None: the first of data/prompts.json
    prompt_ids: list[int] | None = None  # overrides prompt (random-init models have no useful tokenizer)
    max_new_tokens: int = 64
    reps: int = 3
    random_init: str | None = None  # a data/models.json shape: random weights of that shape (GPU runs)
    # ours on CPU: the int4 kernels' activations, set in the child as SCL_KERNEL_ACT either way. "int8" (the
    # engine's default, as llama.cpp quantizes its own) or "fp32"; the worker refuses to report a run whose
    # kernel config differs from it, so the label is what ran.
    act: str = "int8"
    timeout_s: int = 1800

    @classmethod
    def of(cls, **flat) -> "PeerConfig":
        """A config from flat keyword arguments: the setup's fields go to the setup (device cpu unless given)."""
        return cls().with_fields(**flat)

    def with_fields(self, **flat) -> "PeerConfig":
        """A copy with these fields changed, the setup's (model, precision, draft, ...) in the setup."""
        names = {f.name for f in fields(EngineSetup)}
        setup = {k: flat.pop(k) for k in list(flat) if k in names}
        return replace(self, setup=replace(self.setup, **setup), **flat)

    def measure(self, pool=None, store=None, progress=None):
        """Measure in a fresh process (the interface runner.run_many calls; the pool is not used)."""
        return measure(self, store, progress)

    def __post_init__(self):
        # One vocabulary: "bnb-nf4", "bfloat16" and the like are accepted and stored canonically.
        if self.system != "llama.cpp" and isinstance(self.setup.precision, str):
            try:
                self.setup = replace(self.setup, precision=parse_precision(self.setup.precision))
            except UserError:
                pass  # validate() names the choices

    def validate(self) -> "PeerConfig":
        st = self.setup
        if self.system not in SYSTEMS:
            raise UserError(f"unknown peer system '{self.system}'", f"use one of: {', '.join(SYSTEMS)}")
        if st.draft not in DRAFTS[self.system]:
            raise UserError(f"{self.system} has no '{st.draft}' draft",
                            f"use one of: {', '.join(DRAFTS[self.system])}")
        if self.system == "transformers" and st.precision not in HF_PRECISIONS:
            raise UserError(f"transformers peer has no precision '{st.precision}'",
                            f"use one of: {', '.join(HF_PRECISIONS)}")
        if self.system == "llama.cpp":
            if st.precision not in LLAMA_PRECISIONS:
                raise UserError(f"llama.cpp peer runs {', '.join(LLAMA_PRECISIONS)}, not '{st.precision}'",
                                "use precision Q4_K_M (the catalog GGUF as shipped) or another of those")
        if self.random_init and (self.system == "llama.cpp" or st.draft == "model"):
            raise UserError(f"{self.label} cannot run on random weights: it needs a GGUF file or a trained draft",
                            "on random-init shapes use self or ngram drafts, and no llama.cpp")
        if self.act not in ("fp32", "int8") or (self.act == "fp32" and self.system != OURS):
            raise UserError(f"activation mode '{self.act}' is not offered for {self.system}",
                            "act chooses serving-cost-lab's int4 kernels' activations ('int8', the default, or "
                            "'fp32'); other systems run their own and take the default")
        if self.system == OURS:
            self.setup = st.validate()
        if not isinstance(self.max_new_tokens, int) or not 2 <= self.max_new_tokens <= 4096:
            raise UserError(f"max_new_tokens {self.max_new_tokens} is out of range", "use 2 to 4096")
        if not isinstance(self.reps, int) or not 1 <= self.reps <= 50:
            raise UserError(f"reps {self.reps} is out of range", "use 1 to 50 repetitions")
        return self

    @property
    def label(self) -> str:
        """Ours: the system, the setup's precision and draft labels (EngineSetup's, the model said once per
        record) and "fp32 act" when the int4 kernels ran fp32 activations (int8, the engine's default, unmarked,
        so the label equals the lab's own for the same configuration); a peer: its system, precision and draft."""
        st = self.setup
        if self.system == OURS:
            return f"{OURS} {st.precision_label}{st.draft_label}" + (" fp32 act" if self.act == "fp32" else "")
        s = f"{self.system} {st.precision}" + (" (bitsandbytes)" if st.precision in BNB_PRECISIONS else "")
        if st.draft == "model":
            s += f" + {st.draft_model}@{st.precision} draft"
        elif st.draft == "ngram":
            # llama.cpp's row is llama-cpp-python's Python LlamaPromptLookupDecoding (it asks for every
            # position's logits), not llama.cpp's own n-gram drafting: that is llama-server's (servers.py)
            s += " + Python prompt lookup (llama-cpp-python)" if self.system == "llama.cpp" else " + prompt lookup"
        return s

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "PeerConfig":
        """A config from `to_dict()`'s form (the setup nested), or the flat form older records keep; an
        unknown key is refused by name."""
        d = dict(read_object(d, "peer config", {f.name for f in fields(cls)} | {f.name for f in fields(EngineSetup)},
                             "send PeerConfig.to_dict()"))
        setup = d.pop("setup", None)
        base = cls(setup=EngineSetup.from_dict(setup)) if isinstance(setup, dict) else cls()
        return base.with_fields(**d)


# ---------------------------------------------------------------- availability

def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def unavailable_reason(cfg: PeerConfig) -> str | None:
    """Why this peer cannot run here (None when it can). Cheap: no model is loaded."""
    if cfg.system == "transformers":
        if not _has("transformers"):
            return "transformers is not installed (pip install transformers)"
        if cfg.setup.precision in BNB_PRECISIONS and not _has("bitsandbytes"):
            return "bitsandbytes is not installed (pip install bitsandbytes)"
        if cfg.setup.precision == "fp16" and cfg.setup.device == "cpu":
            return "fp16 matmuls on CPU are emulated and not a configuration anyone serves; use bf16"
    if cfg.system == "llama.cpp" and not _has("llama_cpp"):
        return ("llama-cpp-python is not installed; `make peers` builds it from PyPI (about 8 minutes on 2 cores)")
    if cfg.system == "llama.cpp" and (why := gguf_tools.llama_precision_unavailable(cfg.setup.precision)):
        return why
    if cfg.setup.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return "no CUDA GPU is visible to torch"
    return None


def measure(cfg: PeerConfig, store=None, progress=None, env: dict[str, str] | None = None):
    """Run one peer in a subprocess and return its RunRecord (kind "peer"). `env`: environment changes for
    the subprocess (an A/B row's kernel setting); the kernel settings it asks for, and cfg.act, are checked
    against what the subprocess recorded, so a label never names a setting that did not run.

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
        child_env = _child_env(cfg, env or {})
        result, reason, status = _spawn(cfg, child_env)
        if reason is None and cfg.system == OURS:
            reason = _settings_mismatch(child_env, (result or {}).get("kernels", {}).get("settings"))
            if reason:
                result, status = None, "failed"
    config = _record_config(cfg, result)
    rec = RunRecord(kind="peer", config=config, metrics=(result or {}).get("metrics", {}),
                    machine=(result or {}).get("machine") or _machine(cfg.setup.device),
                    versions=(result or {}).get("versions") or {},
                    kernels=(result or {}).get("kernels") or {},
                    output=(result or {}).get("output") or {},
                    notes="" if reason is None else f"{status}: {reason}")
    if store is not None and reason is None:
        store.save_run(rec)
    return rec


def _record_config(cfg: PeerConfig, result: dict | None) -> dict:
    st = cfg.setup
    draft = st.to_record()["draft"]
    if draft is not None:
        if cfg.system != OURS:  # a peer drafts at its target's precision, with its own number of tokens
            draft.update(precision=st.precision if st.draft == "model" else None, gamma=None, adaptive=None)
        draft["setting"] = (result or {}).get("draft_setting")
    return {"system": cfg.system, "label": cfg.label, "model": st.model, "precision": st.precision,
            "device": st.device, "batch_size": 1, "max_new_tokens": cfg.max_new_tokens, "draft": draft,
            "reps": cfg.reps, "random_init": cfg.random_init, "setup": st.to_dict() if cfg.system == OURS else None,
            "calibration": (result or {}).get("calibration"),
            "peer_config": cfg.to_dict()}


def _machine(device: str) -> dict:
    import torch

    from engine.measure.machine import machine_facts

    return machine_facts(device if device.startswith("cuda") and torch.cuda.is_available() else "cpu")


def _child_env(cfg: PeerConfig, changes: dict[str, str]) -> dict[str, str]:
    env = {**os.environ, **changes}
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["SCL_KERNEL_ACT"] = cfg.act  # explicit both ways: unset means the engine's default, not the label's
    return env


def _settings_mismatch(env: dict[str, str], ran: dict | None) -> str | None:
    """Why the subprocess's recorded kernel settings are not the ones its environment asked for (None: they are)."""
    from engine.ops.config import KernelConfig

    if ran is None:
        return "the subprocess recorded no kernel settings, so its label cannot be checked"
    asked = KernelConfig.from_env(env).to_dict()
    wrong = {k: (v, ran.get(k)) for k, v in asked.items() if ran.get(k) != v}
    if wrong:
        return ("the subprocess ran other kernel settings than its label says: "
                + ", ".join(f"{k} {got!r} (asked {want!r})" for k, (want, got) in wrong.items()))
    return None


def _spawn(cfg: PeerConfig, env: dict[str, str]) -> tuple[dict | None, str | None, str]:
    """(result, None, "ok"), or (None, reason, "unavailable" | "failed"); `env` is the child's (_child_env)."""
    root = str(REPO_ROOT)
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


