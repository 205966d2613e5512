"""Quality against full precision, as llama.cpp's `--kl-divergence` mode measures it.

The text is engine.measure.eval_text: ShareGPT answers (chat) and HumanEval solutions (code), 8,192
scored tokens by default, one document at a time. Each configuration's next-token distributions
are compared with the fp32 model's: KL(fp32 || config) with its mean ± standard error, median and
upper percentiles, "same top-1", Δp of the next token, and both perplexities (engine.measure.kld has
the definitions). Per category and overall.

The fp32 reference is computed once and cached on disk in compressed form (kld.Reference: every
token with probability >= 1e-6 and its log-prob, the log of the mass outside them, the top-1 and
the next token's log-prob: 54 MB for 8,192 positions of the 1.5B instead of 5 GB of full log-probs;
its KL reads about 0.6% low, see engine.measure.kld). The cache is keyed by what the weights are, not by
their name: the catalog's conversion manifest (the GGUF's sha256 and the converted files' sizes),
else the sha256 of a folder's safetensors files, else (a model built in memory, such as the test
models) the sha256 of the fp32 state dict. The key also holds the sha256 of the token ids. A file
that does not read back, or whose recorded weights, ids, floor or shapes differ, is recomputed.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.common.errors import UserError
from engine.common.fields import QC, Q
from engine.measure.eval_text import DEFAULT_TOKENS, CATEGORIES, EvalDoc, describe, eval_docs, fingerprint, flat_ids
from engine.measure.kld import PROB_FLOOR, Reference, Scores, compress, score, score_full, summarize

CHUNK = 128  # positions per forward pass: [128, 151936] fp32 log-probs are 78 MB
FORMAT = "scl-quality-reference-3"
FIELDS = ("offsets", "idx", "lp", "rest_lp", "top1", "target_lp")


# ---------------------------------------------------------------- forward passes

def _chunks(lm, ids, chunk: int = CHUNK, kv_dtype: str = "auto"):
    """(start, end, log-probs [end - start, V] on the model's device) over one document, fresh cache
    (a paged one at kv_dtype when that is not the compute dtype: the KV cache's own quality loss)."""
    model = lm.model
    t = torch.tensor([list(ids)], device=lm.device)
    if kv_dtype == "auto":
        cache = model.new_cache(1, len(ids))
    else:
        from engine.infer.paged import check_kv_dtype, one_sequence_cache

        cache = one_sequence_cache(model, len(ids), check_kv_dtype(kv_dtype, lm.device))
    for s in range(0, len(ids) - 1, chunk):
        e = min(s + chunk, len(ids) - 1)
        logits = model(t[:, s:e], s, cache)[0]
        yield s, e, torch.log_softmax(logits.float(), -1)


@torch.inference_mode()
def logprobs(lm, ids: list[int], chunk: int = CHUNK) -> torch.Tensor:
    """log-softmax of the next-token prediction at every position but the last: [T-1, V] fp32, CPU."""
    return torch.cat([lp.cpu() for _, _, lp in _chunks(lm, ids, chunk)])


def eval_ids(tokenizer, max_tokens: int = 512) -> list[int]:
    """The first `max_tokens` ids of the eval text, its documents joined (for one-sequence checks)."""
    return flat_ids(eval_docs(tokenizer, max(max_tokens, len(CATEGORIES))), max_tokens)


def compare(ref_lp: torch.Tensor, lp: torch.Tensor, ids: list[int]) -> dict:
    """The statistics of full log-probs `lp` against full reference log-probs `ref_lp` (exact KL)."""
    targets = torch.tensor(ids[1: 1 + lp.shape[0]])
    return summarize(score_full(ref_lp, lp, targets))


# ---------------------------------------------------------------- what the weights are

_FILE_SHA: dict[tuple[str, int, int], str] = {}
_IN_MEMORY: dict[tuple[str, str], str] = {}  # (name, folder) -> the fp32 state-dict hash seen in this process


def _file_sha(p: Path) -> str:
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _FILE_SHA:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
        _FILE_SHA[key] = h.hexdigest()
    return _FILE_SHA[key]


def _state_sha(model) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous().reshape(-1)
        h.update(f"{name}:{t.dtype}:{t.numel()};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def weights_fingerprint(name: str, folder, fp32_lm=None) -> str | None:
    """What identifies the fp32 weights behind a model (see the module docstring); None when unknown.

    A model without files is known from `fp32_lm` (its fp32 copy), then remembered by (name, folder)
    for this process, so its quantized copies find the same reference.
    """
    folder = Path(str(folder))
    manifest = folder / "manifest.json"
    if manifest.is_file():
        man = json.loads(manifest.read_text())
        return "catalog:" + hashlib.sha256(json.dumps({"source": man.get("source_sha256"), "files": man.get("files")},
                                                      sort_keys=True).encode()).hexdigest()
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if files:
        return "files:" + hashlib.sha256("".join(f"{f.name}={_file_sha(f)};" for f in files).encode()).hexdigest()
    key = (str(name), str(folder))
    if fp32_lm is not None:
        _IN_MEMORY[key] = "state:" + _state_sha(fp32_lm.model)
    return _IN_MEMORY.get(key)


# ---------------------------------------------------------------- the cached reference

def reference_path(weights: str, docs: list[EvalDoc]) -> Path:
    from engine.common.paths import cache_dir

    w = hashlib.sha256(weights.encode()).hexdigest()[:16]
    return cache_dir() / "quality" / f"ref-{w}-{fingerprint(docs)[:16]}.safetensors"


def _meta(weights: str, docs: list[EvalDoc]) -> dict[str, str]:
    return {"format": FORMAT, "weights": weights, "ids_sha256": fingerprint(docs), "floor": repr(PROB_FLOOR),
            "positions": str(sum(d.positions for d in docs))}


def _consistent(t: dict[str, torch.Tensor], n: int) -> bool:
    """Whether the tensors of a stored reference fit together for n positions."""
    off = t["offsets"]
    if off.shape != (n + 1,) or int(off[0]) != 0 or int(off[-1]) != t["idx"].numel():
        return False
    if t["lp"].shape != t["idx"].shape or any(t[x].shape != (n,) for x in ("rest_lp", "top1", "target_lp")):
        return False
    return bool(torch.isfinite(t["lp"]).all()) and not (n and bool((off[1:] < off[:-1]).any()))


def read_reference(path: Path, meta: dict[str, str] | None = None) -> Reference | None:
    """The reference stored at `path`, or None when it is missing, torn, or not what `meta` says."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            got = f.metadata() or {}
            t = {n: f.get_tensor(n).clone() for n in FIELDS}  # a copy: the file may be replaced later
        n = int(got.get("positions", -1))
    except Exception:  # missing, truncated, not a safetensors file, no such tensor
        return None
    if got.get("format") != FORMAT or (meta is not None and any(got.get(k) != v for k, v in meta.items())):
        return None
    if not _consistent(t, n):
        return None
    off = t["offsets"]
    return Reference(off.long(), t["idx"].long(), t["lp"].float(), t["rest_lp"].float(), t["top1"].long(),
                     t["target_lp"].float())


@torch.inference_mode()
def compute_reference(ref_lm, docs: list[EvalDoc], on_tokens=None) -> Reference:
    """The compressed reference of an fp32 model over the documents (no cache)."""
    parts = []
    for d in docs:
        for s, e, lp in _chunks(ref_lm, d.ids):
            parts.append(compress(lp, torch.tensor(d.ids[s + 1: e + 1], device=lp.device)))
            if on_tokens:
                on_tokens(e - s)
    return Reference.cat(parts)


def ensure_reference(name: str, folder, docs: list[EvalDoc], ref_lm=None, progress=None, on_tokens=None,
                     device: str = "cpu") -> Path:
    """The path of the cached fp32 reference for these weights and documents, computed first if needed.

    `ref_lm` is the fp32 model to compute it with; without it the fp32 model is loaded by name on `device`.
    """
    from safetensors.torch import save_file

    say = progress or (lambda s: None)
    if ref_lm is not None and ref_lm.spec.precision != "fp32":
        raise UserError(f"the quality reference must come from fp32, not {ref_lm.spec.label}",
                        "pass the fp32 copy of the model as ref_lm")
    weights = weights_fingerprint(name, folder, ref_lm)
    if weights is not None:
        path = reference_path(weights, docs)
        if read_reference(path, _meta(weights, docs)) is not None:
            return path
        if path.exists():
            say("the cached fp32 reference is torn or stale; recomputing it")
    if ref_lm is None:
        from engine.infer.loader import load

        say(f"loading {name} at fp32 for the quality reference (once per text)")
        ref_lm = load(name, "fp32", device, progress)
        weights = weights_fingerprint(name, folder, ref_lm)
    say(f"computing the fp32 reference of {name} on {sum(d.positions for d in docs):,} tokens (cached once)")
    ref = compute_reference(ref_lm, docs, on_tokens)
    path = reference_path(weights, docs)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # two writers never share a temporary file
    save_file(ref.tensors(), str(tmp), metadata=_meta(weights, docs))
    tmp.replace(path)  # atomic: a reader sees the old file or the whole new one
    return path


def load_reference(path: Path, docs: list[EvalDoc]) -> Reference:
    """The reference at `path` for these documents; a UserError when it is not (ensure_reference first)."""
    ref = read_reference(path, {"ids_sha256": fingerprint(docs), "positions": str(sum(d.positions for d in docs))})
    if ref is None:
        raise UserError(f"the quality reference {path.name} is missing, torn, or for other token ids",
                        "compute it with engine.measure.quality.ensure_reference")
    return ref


def has_reference(lm, max_tokens: int = DEFAULT_TOKENS) -> bool:
    """Whether the fp32 reference for this model's weights and this eval length is already cached."""
    docs = eval_docs(lm.tokenizer, max_tokens)
    weights = weights_fingerprint(lm.name, lm.folder, lm if lm.spec.precision == "fp32" else None)
    return weights is not None and read_reference(reference_path(weights, docs), _meta(weights, docs)) is not None


# ---------------------------------------------------------------- scoring

def categories_of(docs: list[EvalDoc]) -> list[str]:
    """The category of every scored position, in order."""
    return [d.category for d in docs for _ in range(d.positions)]


def results(scores: Scores, docs: list[EvalDoc]) -> dict:
    """Overall statistics (flat keys), `by_category`, and what was scored."""
    out = summarize(scores)
    cats = categories_of(docs)
    out[Q.by_category] = {}
    for c in CATEGORIES:
        mask = torch.tensor([x == c for x in cats], dtype=torch.bool)
        if mask.any():
            out[Q.by_category][c] = {**summarize(scores.select(mask)),
                                     QC.documents: sum(1 for d in docs if d.category == c)}
    info = describe(docs)
    out.update({Q.eval_text: info["eval_text"], Q.eval_fingerprint: info["eval_fingerprint"],
                Q.documents: info["documents"], Q.reference_floor: PROB_FLOOR})
    return out


@torch.inference_mode()
def score_model(lm, docs: list[EvalDoc], ref: Reference, on_tokens=None, kv_dtype: str = "auto") -> Scores:
    """Per-position scores of a loaded model (its K/V cached at kv_dtype) against the reference."""
    parts, off = [], 0
    for d in docs:
        for s, e, lp in _chunks(lm, d.ids, kv_dtype=kv_dtype):
            targets = torch.tensor(d.ids[s + 1: e + 1], device=lp.device)
            parts.append(score(ref.slice(off + s, off + e, lp.device), lp, targets))
            if on_tokens:
                on_tokens(e - s)
        off += d.positions
    return Scores.cat(parts)


def evaluate(lm, max_tokens: int = DEFAULT_TOKENS, ref_lm=None, progress=None, *, on_tokens=None,
             docs: list[EvalDoc] | None = None, kv_dtype: str = "auto") -> dict:
    """llama.cpp-style statistics of `lm` (its K/V cached at kv_dtype) against its fp32 reference on
    `max_tokens` scored tokens.

    ref_lm: the fp32 copy to compute a missing reference with (else `lm` itself when it is fp32, else
    loaded by name). on_tokens(n) is called as positions are scored (progress bars).
    """
    docs = docs if docs is not None else eval_docs(lm.tokenizer, max_tokens)
    src = ref_lm if ref_lm is not None else (lm if lm.spec.precision == "fp32" else None)
    path = ensure_reference(lm.name, lm.folder, docs, src, progress, device=lm.device)
    (progress or (lambda s: None))(f"scoring {lm.label} on {sum(d.positions for d in docs):,} tokens")
    return results(score_model(lm, docs, load_reference(path, docs), on_tokens, kv_dtype), docs)


# ---------------------------------------------------------------- per position, and matching a peer's quality

def position_profile(scores: Scores, docs: list[EvalDoc], first: int = 4) -> dict:
    """KL by position inside each document: positions 0 .. first-1 (mean, max, and how many documents
    have KL > 1 there) and the rest (mean, median), plus the share of the total KL the first positions carry.

    A position is the prediction of token p+1 from tokens 0..p of its document (engine.measure.eval_text),
    so position 0 sees the document's first token alone: the attention-sink position.
    """
    pos = torch.tensor([p for d in docs for p in range(d.positions)])
    if pos.numel() != scores.kl.numel():
        raise ValueError(f"{scores.kl.numel()} scores for {pos.numel()} positions of these documents")
    out: dict = {}
    for p in range(first):
        kl = scores.kl[pos == p]
        out[str(p)] = {"documents": int(kl.numel()), "kld_mean": float(kl.mean()) if kl.numel() else None,
                       "kld_max": float(kl.max()) if kl.numel() else None, "over_1": int((kl > 1).sum()),
                       "same_top1": float(scores.same_top1[pos == p].double().mean()) if kl.numel() else None}
    rest = scores.kl[pos >= first]
    out["rest"] = {"positions": int(rest.numel()), "kld_mean": float(rest.mean()) if rest.numel() else None,
                   "kld_median": float(rest.median()) if rest.numel() else None}
    total = float(scores.kl.sum())
    out["first_share_of_total_kl"] = float(scores.kl[pos < first].sum()) / total if total > 0 else 0.0
    return out


MATCH_KEYS = {"kld_median": "lower", "kld_p99": "lower", "top1_agreement": "higher"}


def quality_matched(candidates: dict[str, dict], target: dict, keys: dict[str, str] | None = None) -> dict:
    """Which candidates are no worse than `target` on every statistic of `keys`, and the one to time.

    candidates: {label: statistics (engine.measure.kld.summarize keys; "weight_bytes" if known)};
    target: the peer's statistics on the same reference and tokens. keys: {statistic: "lower" | "higher"}
    (which way is better); by default KLD median and p99 (lower) and same top-1 (higher). Ties count as
    no worse. Returns {"matched": [labels, in the order given], "misses": {label: [the statistics it
    loses on]}, "pick": the matched candidate with the fewest weight bytes (then the first given) or
    None when none matches, "keys": keys}. A statistic missing from a candidate or the target is refused.
    """
    keys = dict(MATCH_KEYS if keys is None else keys)
    for k, way in keys.items():
        if way not in ("lower", "higher"):
            raise ValueError(f"statistic {k}: 'lower' or 'higher' is better, not {way!r}")
        if target.get(k) is None:
            raise ValueError(f"the target has no {k}")
    matched, misses = [], {}
    for label, c in candidates.items():
        lost = []
        for k, way in keys.items():
            if c.get(k) is None:
                raise ValueError(f"candidate {label} has no {k}")
            if (c[k] > target[k]) if way == "lower" else (c[k] < target[k]):
                lost.append(k)
        if lost:
            misses[label] = lost
        else:
            matched.append(label)
    order = {label: i for i, label in enumerate(candidates)}
    pick = min(matched, key=lambda x: (candidates[x].get("weight_bytes") or float("inf"), order[x]), default=None)
    return {"matched": matched, "misses": misses, "pick": pick, "keys": keys}


def record(config: dict, q: dict, device: str = "cpu"):
    """A `quality` RunRecord of one configuration's statistics (metrics.quality), as `engine quality` stores them.

    `config` says what ran: an engine setup's to_record() with system "engine", or a peer's system, label,
    model and precision. Only declared statistics are kept (fields.QUALITY); the weights' bytes beside them.
    """
    from engine.common.fields import QUALITY
    from engine.measure.machine import library_versions, machine_facts
    from engine.measure.records import RunRecord

    keep = {f.name for f in QUALITY}
    m: dict = {"quality": {k: v for k, v in q.items() if k in keep}}
    if q.get("weight_bytes"):
        m["weight_bytes"] = int(q["weight_bytes"])
    return RunRecord(kind="quality", config=config, metrics=m, machine=machine_facts(device),
                     versions=library_versions())


def fp32_for_reference(pool, lm, tokens: int, progress=None):
    """The pool's fp32 copy when a reference must be computed (loaded into the pool once), else None."""
    from engine.infer.loader import make_spec

    ref = pool.peek(lm.name, make_spec("fp32"), lm.device)
    if ref is None and lm.spec.precision != "fp32" and not has_reference(lm, tokens):
        ref = pool.get(lm.name, make_spec("fp32"), lm.device, progress)
    return ref


@dataclass
class QualityItem:
    """A work item (engine.measure.runner.run_many): our engine at one precision scored against fp32 on the eval
    text, stored as a `quality` record. `result` keeps the full statistics (per category too) for printing.

    Given a pool (the backend), the model and, where a reference is missing, its fp32 copy come from it and stay
    there; without one (the CLI), the model is loaded for this item alone and freed after it.
    """
    model: str
    spec: object  # engine.quant.QuantSpec
    tokens: int
    device: str = "auto"
    docs: list | None = None
    on_tokens: object = field(default=None, compare=False, repr=False)  # called with positions as they are scored
    result: dict | None = field(default=None, compare=False, repr=False)

    @property
    def label(self) -> str:
        return self.spec.label

    def measure(self, pool=None, store=None, progress=None):
        import gc

        from engine.common.setup import EngineSetup
        from engine.infer.catalog import CATALOG, canonical_name
        from engine.infer.loader import load, resolve_device

        device = resolve_device(self.device)
        if pool is not None:
            lm = pool.get(self.model, self.spec, device, progress)
            ref = fp32_for_reference(pool, lm, self.tokens, progress)
        else:
            lm, ref = load(self.model, self.spec, device, progress=progress), None
        q = evaluate(lm, self.tokens, ref_lm=ref, progress=progress, on_tokens=self.on_tokens, docs=self.docs)
        self.result = {"model": lm.name, "precision": lm.spec.label, "weight_bytes": lm.weight_bytes, **q}
        name = canonical_name(self.model) if canonical_name(self.model) in CATALOG else str(self.model)
        s = self.spec
        setup = EngineSetup(model=name, precision=s.precision, group_size=s.group_size,
                            quantize_embeddings=s.quantize_embeddings, quantize_head=s.quantize_head,
                            device=device, method=s.method)
        rec = record({"setup": setup.to_dict(), **setup.to_record(), "device": device, "system": "engine",
                      "calibration": lm.calibration}, self.result, device)
        if store is not None:
            store.save_run(rec)
        if pool is None:
            del lm, ref
            gc.collect()
        return rec
