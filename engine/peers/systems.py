"""Peer systems measured the same way as our engine: transformers, bitsandbytes, llama.cpp.

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
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace

from engine.common.errors import UserError
from engine.common.paths import REPO_ROOT

SYSTEMS = ("serving-cost-lab", "transformers", "llama.cpp")
OURS = "serving-cost-lab"
# Per system: the precisions and draft kinds it offers. "ngram" is prompt lookup in every system.
HF_PRECISIONS = ("fp32", "bf16", "fp16", "bnb-int8", "bnb-nf4")
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
        s = f"{self.system} {self.precision}" + (" a8" if self.act == "int8" else "")
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
        if cfg.precision.startswith("bnb-") and not _has("bitsandbytes"):
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


def available_systems(device: str = "cpu") -> dict[str, str | None]:
    """System -> None when installed, else the reason (for the dashboard's peer picker)."""
    return {s: unavailable_reason(PeerConfig(system=s, precision=("Q4_K_M" if s == "llama.cpp" else "bf16"),
                                             device=device)) for s in SYSTEMS}


def default_peer_configs(model="default", draft_model="default-draft", max_new_tokens=64, reps=3,
                         device="cpu", prompt=None) -> list[PeerConfig]:
    """The benchmark's matrix: each peer the way people run it, and our engine at each precision and draft."""
    base = PeerConfig(model=model, draft_model=draft_model, max_new_tokens=max_new_tokens, reps=reps,
                      device=device, prompt=prompt)
    hf, ll, us = "transformers", "llama.cpp", OURS

    def c(system, precision, draft="none", **kw):
        d = base.to_dict() | {"system": system, "precision": precision, "draft": draft} | kw
        return PeerConfig.from_dict(d)

    out = [c(hf, "fp32"), c(hf, "bf16"), c(hf, "fp32", "model"), c(hf, "bf16", "model"), c(hf, "fp32", "ngram"),
           c(hf, "bnb-int8"), c(hf, "bnb-nf4"),
           c(ll, "Q4_K_M"), c(ll, "Q4_K_M", "ngram")]
    out += [c(us, p) for p in ("fp32", "bf16", "int8", "int4")]
    out += [c(us, "int8", "model", draft_precision="int4", gamma=4),
            c(us, "int4", "model", draft_precision="int4", gamma=2),
            c(us, "int8", "self", draft_precision="int4", gamma=4), c(us, "int4", "ngram", gamma=4),
            c(us, "int8", "ngram", gamma=4)]
    # int8 activations in the int4 kernels (VNNI), as llama.cpp quantizes its activations to 8 bits.
    out += [c(us, "int4", act="int8"), c(us, "int4", "model", draft_precision="int4", gamma=3, act="int8"),
            c(us, "int8", "model", draft_precision="int4", gamma=4, act="int8")]
    return out


# ---------------------------------------------------------------- the parent side

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

    from engine.measure.metrics import machine_facts

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
        p = subprocess.run([sys.executable, "-m", "engine.peers.systems"], input=json.dumps(cfg.to_dict()), text=True,
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


# ---------------------------------------------------------------- the worker side (in the subprocess)

@dataclass
class _Timed:
    tokens: list[int]
    t0: float
    stamps: list[float] = field(default_factory=list)


class _Clock:
    """Timestamps new tokens as a generator hands them over (a transformers streamer, or a callback)."""

    def __init__(self):
        self.stamps: list[float] = []
        self.tokens: list[int] = []
        self._prompt_seen = False

    # transformers streamer protocol: the first put() is the prompt.
    def put(self, value):
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        ids = value.reshape(-1).tolist()
        t = time.perf_counter()
        self.tokens += ids
        self.stamps += [t] * len(ids)

    def end(self):
        pass

    def on_token(self, i, tok, piece, origin):
        self.tokens.append(int(tok))
        self.stamps.append(time.perf_counter())


def _prompt_ids(cfg: PeerConfig, tokenizer) -> list[int]:
    if cfg.prompt_ids:
        return list(cfg.prompt_ids)
    from engine.infer.tokens import encode_prompts
    from engine.measure.runs import default_prompts

    return encode_prompts(tokenizer, [cfg.prompt or default_prompts()[0]], chat=True)[0]


def _stats(runs: list[_Timed], n: int) -> dict:
    ttft = [r.stamps[0] - r.t0 for r in runs]
    tok_s = [(n - 1) / (r.stamps[n - 1] - r.stamps[0]) for r in runs if r.stamps[n - 1] > r.stamps[0]]
    total = [r.stamps[n - 1] - r.t0 for r in runs]
    # Gaps between consecutive tokens as they reach Python; ~0 inside a batch of accepted drafts,
    # so there is no per-step median here (peers do not expose their steps): the mean, and the p90 gap.
    gaps = sorted(b - a for r in runs for a, b in zip(r.stamps[:n - 1], r.stamps[1:n]))
    from engine.measure.records import percentile

    return {"ttft_s": statistics.median(ttft), "decode_tok_s": statistics.median(tok_s) if tok_s else None,
            "e2e_tok_s": n / statistics.median(total), "new_tokens": n,
            "token_latency_ms_mean": 1000 * (sum(gaps) / len(gaps)) if gaps else None,
            "token_gap_ms_p90": 1000 * percentile(gaps, 90) if gaps else None,
            "reps_decode_tok_s": tok_s, "reps_ttft_s": ttft}


def _run_reps(cfg: PeerConfig, one) -> tuple[list[_Timed], object]:
    """one(n_tokens) -> _Timed. Warm up once (8 tokens), then time cfg.reps runs of N tokens."""
    from engine.measure.metrics import PeakMemory

    one(min(8, cfg.max_new_tokens))
    runs = []
    with PeakMemory(cfg.device) as mem:
        for _ in range(cfg.reps):
            r = one(cfg.max_new_tokens)
            if len(r.stamps) < cfg.max_new_tokens:
                raise RuntimeError(f"{cfg.label} produced {len(r.stamps)} of {cfg.max_new_tokens} tokens")
            runs.append(r)
    return runs, mem


def _hf_worker(cfg: PeerConfig, folder, draft_folder) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = cfg.device
    kw: dict = {}
    if cfg.precision.startswith("bnb-"):
        from transformers import BitsAndBytesConfig

        kw["quantization_config"] = (BitsAndBytesConfig(load_in_8bit=True) if cfg.precision == "bnb-int8" else
                                     BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                        bnb_4bit_compute_dtype=torch.bfloat16))
        kw["dtype"] = torch.bfloat16 if dev.startswith("cuda") else torch.float32
        kw["device_map"] = dev
    else:
        kw["dtype"] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.precision]
    t = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(folder), **kw)
    if "device_map" not in kw:
        model = model.to(dev)
    model.eval()
    tok = AutoTokenizer.from_pretrained(str(folder)) if cfg.prompt_ids is None else None
    gen_kw: dict = {}
    setting = None
    if cfg.draft == "model":
        gen_kw["assistant_model"] = AutoModelForCausalLM.from_pretrained(str(draft_folder), **kw)
        if "device_map" not in kw:
            gen_kw["assistant_model"] = gen_kw["assistant_model"].to(dev)
        gc = gen_kw["assistant_model"].generation_config
        setting = {k: (getattr(gc, k, None) if getattr(gc, k, None) is not None else "transformers default")
                   for k in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")}
    elif cfg.draft == "ngram":
        gen_kw["prompt_lookup_num_tokens"] = HF_PROMPT_LOOKUP_TOKENS
        setting = {"prompt_lookup_num_tokens": HF_PROMPT_LOOKUP_TOKENS}
    load_s = time.perf_counter() - t
    ids = _prompt_ids(cfg, tok)
    x = torch.tensor([ids], device=dev)

    @torch.inference_mode()
    def one(n):
        clock = _Clock()
        t0 = time.perf_counter()
        model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                       temperature=None, top_p=None, top_k=None, streamer=clock, pad_token_id=0, **gen_kw)
        return _Timed(clock.tokens, t0, clock.stamps)

    runs, mem = _run_reps(cfg, one)
    wb = sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers())
    return {"runs": runs, "mem": mem, "load_s": load_s, "weight_bytes": wb, "prompt_ids": ids,
            "draft_setting": setting, "versions": _versions("transformers", "bitsandbytes")}


def _llama_worker(cfg: PeerConfig) -> dict:
    import llama_cpp

    from engine.infer.catalog import gguf_path, resolve
    from engine.infer.loader import load_tokenizer

    path = gguf_path(cfg.model)
    kw = {}
    setting = None
    if cfg.draft == "ngram":
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        kw["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=LLAMA_LOOKUP_TOKENS)
        setting = {"num_pred_tokens": LLAMA_LOOKUP_TOKENS, "max_ngram_size": 2}
    t = time.perf_counter()
    threads = os.cpu_count() or 1
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                          n_gpu_layers=-1 if cfg.device.startswith("cuda") else 0, seed=0, verbose=False, **kw)
    load_s = time.perf_counter() - t
    # The same ids as everyone else: the lab's tokenizer (the GGUF's own tokenizer is the same vocabulary).
    ids = _prompt_ids(cfg, load_tokenizer(resolve(cfg.model)) if cfg.prompt_ids is None else None)

    def one(n):
        toks, stamps = [], []
        # llama-cpp-python reuses the KV cache for a prompt prefix it has seen; the others have no
        # prompt cache, so every repetition starts empty (else TTFT is one token's decode).
        llm.reset()
        t0 = time.perf_counter()
        for tk in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            toks.append(int(tk))
            stamps.append(time.perf_counter())
            if len(toks) >= n:
                break
        return _Timed(toks, t0, stamps)

    runs, mem = _run_reps(cfg, one)
    return {"runs": runs, "mem": mem, "load_s": load_s, "weight_bytes": os.path.getsize(path), "prompt_ids": ids,
            "draft_setting": setting, "versions": _versions("llama_cpp_python") | {"n_threads": threads}}


def _ours_worker(cfg: PeerConfig, folder, draft_folder) -> dict:
    from engine.ops import kernels
    from engine.infer.generate import generate
    from engine.infer.loader import load, make_spec
    from engine.infer.speculative import generate_speculative, make_proposer

    t = time.perf_counter()
    target = load(str(folder), make_spec(cfg.precision), cfg.device)
    draft = None
    if cfg.draft == "model":
        draft = load(str(draft_folder), make_spec(cfg.draft_precision), cfg.device)
    elif cfg.draft == "self":
        draft = load(str(folder), make_spec(cfg.draft_precision), cfg.device)
    load_s = time.perf_counter() - t
    ids = _prompt_ids(cfg, target.tokenizer)
    last_spec = {}

    def one(n):
        clock = _Clock()
        t0 = time.perf_counter()
        if cfg.draft == "none":
            generate(target, [""], n, on_token=clock.on_token, prompt_ids=[ids], stop_at_eos=False)
        else:
            res = generate_speculative(target, make_proposer(cfg.draft, draft, target), [""], n, cfg.gamma,
                                       on_token=clock.on_token, prompt_ids=[ids], stop_at_eos=False)
            last_spec.update(res.spec)
        return _Timed(clock.tokens, t0, clock.stamps)

    runs, mem = _run_reps(cfg, one)
    wb = target.weight_bytes + (draft.weight_bytes if draft is not None else 0)
    return {"runs": runs, "mem": mem, "load_s": load_s, "weight_bytes": wb, "prompt_ids": ids,
            "spec": last_spec or None, "kernels": kernels.backend_info(), "versions": _versions()}


def _versions(*pkgs) -> dict:
    from engine.measure.metrics import library_versions

    out = library_versions()
    import importlib.metadata as md

    for p in pkgs:
        try:
            out[p.replace("_", "-")] = md.version(p.replace("_", "-"))
        except md.PackageNotFoundError:
            out[p.replace("_", "-")] = None
    return out


def _folders(cfg: PeerConfig):
    """HF folders for target and draft: the catalog's converted cache, or random weights of a shape."""
    from engine.infer.catalog import resolve

    if cfg.random_init:
        from engine.infer.random_models import random_model_folder

        return random_model_folder(cfg.random_init), None
    return resolve(cfg.model), (resolve(cfg.draft_model) if cfg.draft == "model" else None)


def run_worker(cfg: PeerConfig) -> dict:
    """Measure in this process (the subprocess side of `measure`)."""
    import resource

    import torch

    from engine.measure.metrics import machine_facts

    cfg.validate()
    torch.manual_seed(0)
    if cfg.system == "llama.cpp":
        out = _llama_worker(cfg)
    else:
        folder, draft_folder = _folders(cfg)
        out = (_hf_worker if cfg.system == "transformers" else _ours_worker)(cfg, folder, draft_folder)
    runs, n = out["runs"], cfg.max_new_tokens
    m = _stats(runs, n)
    m.update(out["mem"].as_dict())
    m["load_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    m["weight_bytes"] = out["weight_bytes"]
    m["load_s"] = out["load_s"]
    m["prompt_tokens"] = len(out["prompt_ids"])
    if out.get("spec"):
        m["spec"] = out["spec"]
    return {"metrics": m, "machine": machine_facts(cfg.device), "versions": out["versions"],
            "kernels": out.get("kernels") or {}, "draft_setting": out.get("draft_setting"),
            "output": {"new_tokens": [runs[0].tokens[:n]], "prompt_ids": out["prompt_ids"]}}


def main() -> int:
    cfg = PeerConfig.from_dict(json.loads(sys.stdin.read()))
    try:
        d = run_worker(cfg)
    except UserError as e:  # a refusal that names the fix: this peer cannot run here
        d = {"error": str(e), "status": "unavailable"}
    except ImportError as e:
        d = {"error": f"{type(e).__name__}: {e}", "status": "unavailable"}
    except Exception as e:  # the parent reports it as the reason this peer has no numbers
        import traceback

        traceback.print_exc()
        d = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    print(RESULT_TAG + json.dumps(d, default=str), flush=True)
    return 0


# ---------------------------------------------------------------- comparing results

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


if __name__ == "__main__":
    sys.exit(main())


def dashboard_peer_configs(model: str, draft_model: str, max_new_tokens: int, device: str = "cpu",
                           reps: int = 1) -> tuple[list[PeerConfig], dict[str, str]]:
    """Peer rows the Compare page offers for this model: (installed configs, {label: why not} for the rest)."""
    from engine.infer import catalog
    cname = catalog.canonical_name(model)
    base = PeerConfig(model=model, draft_model=draft_model, max_new_tokens=max(2, int(max_new_tokens)),
                      reps=reps, device=device)
    cands = [replace(base, system="transformers", precision=p) for p in ("fp32", "bf16", "bnb-int8", "bnb-nf4")]
    cands += [replace(base, system="transformers", precision="fp32", draft="model"),
              replace(base, system="transformers", precision="fp32", draft="ngram"),
              replace(base, system="llama.cpp", precision="Q4_K_M"),
              replace(base, system="llama.cpp", precision="Q4_K_M", draft="ngram")]
    ok, missing = [], {}
    for c in cands:
        why = unavailable_reason(c)
        if why is None and c.system == "llama.cpp" and cname not in catalog.CATALOG:
            why = "llama.cpp runs the catalog models' GGUF files; this model has none"
        if why is None and cname not in catalog.CATALOG and not os.path.isdir(model):
            why = "peers load models from disk; pick a catalog model or a local folder"
        if why is None:
            ok.append(c)
        else:
            missing[c.label] = why
    return ok, missing
