"""llama.cpp's own Q4_K_M (or another GGUF of the same weights) on the quality eval text, scored against our
fp32 reference.

The parent (`llama_cpp_quality`) tokenizes the eval text with the lab's tokenizer, makes sure the
fp32 reference is cached (engine.measure.quality), and hands the token ids and the reference's path
to a fresh process (`python -m engine.peers.quality_worker`), as every peer runs. The worker loads
the catalog GGUF exactly as shipped with llama-cpp-python (`logits_all=True`), evaluates each
document from an empty KV cache, and scores every position with the same code and statistics as
our precisions (engine.measure.kld), so the rows compare like for like.

Same token ids for both: the GGUF's vocabulary is checked against ours in the worker (its size,
and each document detokenized by llama.cpp against our decoding); a mismatch fails the run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.common.errors import UserError
from engine.common.paths import REPO_ROOT
from engine.peers.peer import RESULT_TAG, PeerConfig, unavailable_reason

SYSTEM, PRECISION = "llama.cpp", "Q4_K_M"
LABEL = "llama.cpp Q4_K_M (the shipped GGUF)"
CHUNK = 128  # positions scored at a time (log-softmax of [128, 151936])


def llama_cpp_unavailable(model: str) -> str | None:
    """Why llama.cpp's Q4_K_M cannot be scored here for `model` (None when it can). Cheap: loads nothing."""
    from engine.infer.catalog import CATALOG, canonical_name

    reason = unavailable_reason(PeerConfig.of(system=SYSTEM, model=model, precision=PRECISION))
    if reason is None and canonical_name(model) not in CATALOG:
        reason = f"'{model}' is not a catalog model, so there is no shipped GGUF for llama.cpp to run"
    return reason


def llama_cpp_quality(model: str = "default", max_tokens: int | None = None, ref_lm=None, progress=None,
                      timeout_s: int = 3600, *, gguf: str | Path | None = None, precision: str | None = None,
                      label: str | None = None, docs=None, scores: bool = False) -> dict:
    """The quality statistics of a llama.cpp GGUF, as engine.measure.quality.evaluate returns them.

    By default the catalog model's shipped Q4_K_M GGUF. `gguf` scores another GGUF file of the same
    weights and vocabulary instead (bench/quality_matched.py: the reference's weights converted and
    quantized by llama.cpp's own tools), with its `precision` (GGUF type) and `label`; `model` may then be
    any model folder, not only a catalog name. `docs`: the eval documents (else the eval text at
    `max_tokens`). `scores`: also return the per-position scores (engine.measure.kld.Scores.to_lists) as
    "scores", for per-position analysis.

    Adds system, precision, label, weight_bytes and vocab_check. When llama.cpp cannot run here the
    dict is {"system", "precision", "label", "unavailable": reason}; when it fails, "failed": reason.
    `ref_lm` is the fp32 model to compute a missing reference with (else it is loaded by name).
    """
    from engine.infer.catalog import CATALOG, canonical_name, gguf_path, resolve
    from engine.infer.loader import load_tokenizer
    from engine.measure import quality
    from engine.measure.eval_text import DEFAULT_TOKENS, eval_docs

    head = {"system": SYSTEM, "precision": precision or PRECISION, "label": label or LABEL}
    if gguf is None:
        reason = llama_cpp_unavailable(model)
    else:
        reason = unavailable_reason(PeerConfig.of(system=SYSTEM, model="default", precision=PRECISION))
        if reason is None and not Path(gguf).is_file():
            reason = f"the GGUF {gguf} does not exist"
    if reason is not None:
        return {**head, "unavailable": reason}
    name = canonical_name(model) if canonical_name(model) in CATALOG else str(model)
    say = progress or (lambda s: None)
    folder = resolve(model, progress)
    tok = load_tokenizer(folder)
    docs = docs if docs is not None else eval_docs(tok, max_tokens or DEFAULT_TOKENS)
    ref_path = quality.ensure_reference(name, folder, docs, ref_lm, progress)
    gguf = gguf if gguf is not None else gguf_path(model, progress)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    job = {"gguf": str(gguf), "reference": str(ref_path), "vocab": vocab, "scores": bool(scores),
           "docs": [{"id": d.id, "category": d.category, "ids": list(d.ids), "text": tok.decode(list(d.ids))}
                    for d in docs]}
    say(f"scoring {head['label']} on {sum(d.positions for d in docs):,} tokens in a fresh process")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    try:
        p = subprocess.run([sys.executable, "-m", "engine.peers.quality_worker"], input=json.dumps(job), text=True,
                           capture_output=True, timeout=timeout_s, env=env, cwd=str(REPO_ROOT))
    except subprocess.TimeoutExpired:
        return {**head, "failed": f"did not finish within {timeout_s} s (score fewer tokens)"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            d = json.loads(line[len(RESULT_TAG):])
            if "error" in d:
                return {**head, d.get("status", "failed"): d["error"]}
            return {**head, **d}
    tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
    return {**head, "failed": f"the worker exited with status {p.returncode}: {' | '.join(tail)[-400:]}"}


def llama_cpp_record(model: str, q: dict):
    """The `quality` RunRecord of a llama_cpp_quality result for the catalog's shipped GGUF, as the CLI and the
    backend store it: the accuracy table pairs it with llama-server's rows of the same GGUF."""
    from engine.infer.catalog import CATALOG, canonical_name
    from engine.measure import quality

    name = canonical_name(model) if canonical_name(model) in CATALOG else str(model)
    return quality.record({"system": q["system"], "label": q["label"], "model": name, "precision": q["precision"],
                           "weights": "the catalog GGUF as shipped"}, q)


@dataclass
class LlamaQualityItem:
    """A work item (engine.measure.runner.run_many): llama.cpp's shipped Q4_K_M of a catalog model scored against
    the fp32 reference, stored as a `quality` record (the accuracy tables pair it with llama-server's pass@1).
    `result` keeps the full statistics, with the model as asked. Where llama.cpp cannot run, or its run fails,
    it is Skipped with the reason. Given a pool, the reference is made sure of through it first (the backend:
    the fp32 copy stays loaded for later scores); llama.cpp itself runs in a fresh process."""
    model: str
    tokens: int
    device: str = "auto"
    result: dict | None = field(default=None, compare=False, repr=False)

    @property
    def label(self) -> str:
        return f"{SYSTEM} {PRECISION} of {self.model}"

    def measure(self, pool=None, store=None, progress=None):
        from engine.measure.runner import Skipped

        reason = llama_cpp_unavailable(self.model)
        if reason is None and pool is not None:
            from engine.infer.loader import make_spec, resolve_device
            from engine.measure.loaded import reference_in_pool

            # the device a run's setup ("auto") resolves to, so runs and this score share the pool's fp32 copy
            facts = {"name": self.model, "spec": make_spec("fp32"), "device": resolve_device(self.device)}
            with pool.lock:
                reference_in_pool(pool, facts, self.tokens, progress=progress)
        q = llama_cpp_quality(self.model, self.tokens, progress=progress) if reason is None else None
        why = reason or q.get("unavailable") or q.get("failed")
        if why:
            return Skipped(self.label, why)
        self.result = {"model": self.model, "tokens_asked": self.tokens, **q}
        rec = llama_cpp_record(self.model, q)
        if store is not None:
            store.save_run(rec)
        return rec


# ---------------------------------------------------------------- the worker process

def _vocab_check(llm, job: dict) -> dict:
    """The GGUF's vocabulary against ours: size, and every document's ids detokenized by llama.cpp."""
    same_text = sum(llm.detokenize(d["ids"]).decode("utf-8", "replace") == d["text"] for d in job["docs"])
    # Re-tokenizing our decoded text with the GGUF's tokenizer: the same ids unless a cut split a word.
    same_ids = sum(llm.tokenize(d["text"].encode("utf-8"), add_bos=False, special=False) == d["ids"]
                   for d in job["docs"])
    out = {"n_vocab": llm.n_vocab(), "ours": job["vocab"], "documents": len(job["docs"]),
           "detokenized_same": same_text, "retokenized_same": same_ids}
    if out["n_vocab"] != job["vocab"] or same_text != len(job["docs"]):
        raise RuntimeError(f"the GGUF's vocabulary differs from ours: {out}")
    return out


def run_job(job: dict) -> dict:
    import llama_cpp
    import numpy as np
    import torch

    from engine.measure.eval_text import EvalDoc
    from engine.measure.kld import Scores, score
    from engine.measure.quality import load_reference, results

    docs = [EvalDoc(d["id"], d["category"], tuple(d["ids"])) for d in job["docs"]]
    ref = load_reference(Path(job["reference"]), docs)
    n_ctx = max(len(d.ids) for d in docs)
    threads = os.cpu_count() or 1
    t = time.perf_counter()
    llm = llama_cpp.Llama(model_path=job["gguf"], n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
                          n_threads=threads, n_threads_batch=threads, n_gpu_layers=0, seed=0, verbose=False)
    load_s = time.perf_counter() - t
    check = _vocab_check(llm, job)
    parts, off, t = [], 0, time.perf_counter()
    for d in docs:
        llm.reset()
        llm.eval(list(d.ids))
        logits = torch.from_numpy(np.array(llm.scores[: d.positions], dtype=np.float32, copy=True))
        for s in range(0, d.positions, CHUNK):
            e = min(s + CHUNK, d.positions)
            lp = torch.log_softmax(logits[s:e], -1)
            parts.append(score(ref.slice(off + s, off + e), lp, torch.tensor(d.ids[s + 1: e + 1])))
        off += d.positions
    sc = Scores.cat(parts)
    out = results(sc, docs)
    if job.get("scores"):
        out["scores"] = sc.to_lists()
    out.update(weight_bytes=os.path.getsize(job["gguf"]), vocab_check=check, load_s=load_s,
               score_s=time.perf_counter() - t,
               versions={"llama_cpp_python": getattr(llama_cpp, "__version__", None), "n_threads": threads})
    return out


def main() -> int:
    job = json.loads(sys.stdin.read())
    try:
        d = run_job(job)
    except UserError as e:
        d = {"error": str(e), "status": "failed"}
    except ImportError as e:
        d = {"error": f"{type(e).__name__}: {e}", "status": "unavailable"}
    except Exception as e:  # the parent reports it as the reason there are no numbers
        import traceback

        traceback.print_exc()
        d = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
    print(RESULT_TAG + json.dumps(d, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
