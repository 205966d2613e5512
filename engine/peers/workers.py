"""The worker side of a peer measurement, in its own process: load the system, time its tokens, report.

`python -m engine.peers.workers` reads a PeerConfig as JSON on stdin and prints one result line.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field

from engine.common.errors import UserError
from engine.common.fields import M
from engine.common.vocab import BNB_PRECISIONS
from engine.peers.peer import HF_PROMPT_LOOKUP_TOKENS, LLAMA_LOOKUP_TOKENS, RESULT_TAG, PeerConfig


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
    from engine.measure.stats import percentile

    return {M.ttft_s: statistics.median(ttft), M.decode_tok_s: statistics.median(tok_s) if tok_s else None,
            M.e2e_tok_s: n / statistics.median(total), M.new_tokens: n,
            M.token_latency_ms_mean: 1000 * (sum(gaps) / len(gaps)) if gaps else None,
            M.token_gap_ms_p90: 1000 * percentile(gaps, 90) if gaps else None,
            M.reps_decode_tok_s: tok_s, M.reps_ttft_s: ttft}


def _run_reps(cfg: PeerConfig, one) -> tuple[list[_Timed], object]:
    """one(n_tokens) -> _Timed. Warm up once (8 tokens), then time cfg.reps runs of N tokens."""
    from engine.measure.memory import PeakMemory

    one(min(8, cfg.max_new_tokens))
    runs = []
    with PeakMemory(cfg.setup.device) as mem:
        for _ in range(cfg.reps):
            r = one(cfg.max_new_tokens)
            if len(r.stamps) < cfg.max_new_tokens:
                raise RuntimeError(f"{cfg.label} produced {len(r.stamps)} of {cfg.max_new_tokens} tokens")
            runs.append(r)
    return runs, mem


def _hf_worker(cfg: PeerConfig, folder, draft_folder) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = cfg.setup.device
    kw: dict = {}
    if cfg.setup.precision in BNB_PRECISIONS:
        from transformers import BitsAndBytesConfig

        kw["quantization_config"] = (BitsAndBytesConfig(load_in_8bit=True) if cfg.setup.precision == "llm.int8" else
                                     BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                        bnb_4bit_compute_dtype=torch.bfloat16))
        kw["dtype"] = torch.bfloat16 if dev.startswith("cuda") else torch.float32
        kw["device_map"] = dev
    else:
        kw["dtype"] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.setup.precision]
    t = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(folder), **kw)
    if "device_map" not in kw:
        model = model.to(dev)
    model.eval()
    tok = AutoTokenizer.from_pretrained(str(folder)) if cfg.prompt_ids is None else None
    gen_kw: dict = {}
    setting = None
    if cfg.setup.draft == "model":
        gen_kw["assistant_model"] = AutoModelForCausalLM.from_pretrained(str(draft_folder), **kw)
        if "device_map" not in kw:
            gen_kw["assistant_model"] = gen_kw["assistant_model"].to(dev)
        gc = gen_kw["assistant_model"].generation_config
        setting = {k: (getattr(gc, k, None) if getattr(gc, k, None) is not None else "transformers default")
                   for k in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")}
    elif cfg.setup.draft == "ngram":
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

    from engine.infer.catalog import resolve
    from engine.infer.loader import load_tokenizer
    from engine.peers.gguf_tools import llama_gguf

    path = llama_gguf(cfg.setup.model, cfg.setup.precision)
    kw = {}
    setting = None
    if cfg.setup.draft == "ngram":
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        kw["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=LLAMA_LOOKUP_TOKENS)
        setting = {"num_pred_tokens": LLAMA_LOOKUP_TOKENS, "max_ngram_size": 2}
    t = time.perf_counter()
    threads = os.cpu_count() or 1
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                          n_gpu_layers=-1 if cfg.setup.device.startswith("cuda") else 0, seed=0, verbose=False, **kw)
    load_s = time.perf_counter() - t
    # The same ids as everyone else: the lab's tokenizer (the GGUF's own tokenizer is the same vocabulary).
    ids = _prompt_ids(cfg, load_tokenizer(resolve(cfg.setup.model)) if cfg.prompt_ids is None else None)

    runs, mem = _run_reps(cfg, llama_cpp_timed(llm, ids))
    return {"runs": runs, "mem": mem, "load_s": load_s, "weight_bytes": os.path.getsize(path), "prompt_ids": ids,
            "draft_setting": setting, "versions": _versions("llama_cpp_python") | {"n_threads": threads}}


def llama_cpp_timed(llm, ids):
    """one(n): n greedy tokens of llama-cpp-python after `ids`, each timestamped (a _Timed)."""
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
    return one


def _ours_worker(cfg: PeerConfig, folder, draft_folder) -> dict:
    from dataclasses import replace

    from engine import ops as kernels
    from engine.infer.generate import generate
    from engine.infer.loader import load_setup
    from engine.infer.speculative import generate_speculative

    t = time.perf_counter()
    # The setup's models as the folders resolved here (the catalog's cache, or random weights of a shape).
    setup = replace(cfg.setup, model=str(folder),
                    draft_model=str(draft_folder) if draft_folder else cfg.setup.draft_model)
    loaded = load_setup(setup)
    target, draft = loaded.target, loaded.draft
    load_s = time.perf_counter() - t
    ids = _prompt_ids(cfg, target.tokenizer)
    last_spec = {}

    def one(n):
        clock = _Clock()
        t0 = time.perf_counter()
        if loaded.proposer is None:
            generate(target, [""], n, on_token=clock.on_token, prompt_ids=[ids], stop_at_eos=False)
        else:
            res = generate_speculative(target, loaded.proposer, [""], n, setup.gamma, setup.adaptive_gamma,
                                       on_token=clock.on_token, prompt_ids=[ids], stop_at_eos=False)
            last_spec.update(res.spec)
        return _Timed(clock.tokens, t0, clock.stamps)

    runs, mem = _run_reps(cfg, one)
    wb = target.weight_bytes + (draft.weight_bytes if draft is not None else 0)
    return {"runs": runs, "mem": mem, "load_s": load_s, "weight_bytes": wb, "prompt_ids": ids,
            "spec": last_spec or None,
            "kernels": {**kernels.backend_info(), "settings": kernels.kernel_config().to_dict()},
            "versions": _versions(), "calibration": target.calibration}


def _versions(*pkgs) -> dict:
    from engine.measure.machine import library_versions

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
        from engine.peers.random_models import random_model_folder

        return random_model_folder(cfg.random_init), None
    return resolve(cfg.setup.model), (resolve(cfg.setup.draft_model) if cfg.setup.draft == "model" else None)


def run_worker(cfg: PeerConfig) -> dict:
    """Measure in this process (the subprocess side of `measure`)."""
    import resource

    import torch

    from engine.measure.machine import machine_facts

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
    return {"metrics": m, "machine": machine_facts(cfg.setup.device), "versions": out["versions"],
            "kernels": out.get("kernels") or {}, "draft_setting": out.get("draft_setting"),
            "calibration": out.get("calibration"),
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



if __name__ == "__main__":
    sys.exit(main())
