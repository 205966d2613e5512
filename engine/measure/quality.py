"""Quality against full precision, in the spirit of llama.cpp's KL-divergence mode.

On data/eval.txt (written for this project, CC0), we compare each configuration's next-token
distributions with the fp32 model's: perplexity, KL(fp32 || config) mean and p99, and top-1
agreement (the share of positions where both pick the same most likely token).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from engine.common.paths import DATA

EVAL_TEXT = DATA / "eval.txt"


def eval_ids(tokenizer, max_tokens: int = 512, path: Path = EVAL_TEXT) -> list[int]:
    ids = tokenizer(path.read_text())["input_ids"]
    return list(ids[:max_tokens])


@torch.inference_mode()
def logprobs(lm, ids: list[int], chunk: int = 128) -> torch.Tensor:
    """log-softmax of the next-token prediction at every position but the last: [T-1, V] fp32."""
    model = lm.model
    t = torch.tensor([ids], device=lm.device)
    cache = model.new_cache(1, len(ids))
    outs = []
    for s in range(0, len(ids) - 1, chunk):
        e = min(s + chunk, len(ids) - 1)
        logits = model(t[:, s:e], s, cache)[0]
        outs.append(torch.log_softmax(logits.float(), -1).cpu())
    return torch.cat(outs)


def compare(ref_lp: torch.Tensor, lp: torch.Tensor, ids: list[int]) -> dict:
    """Perplexity of both, KL(ref || this) per position, and top-1 agreement."""
    targets = torch.tensor(ids[1 : 1 + lp.shape[0]])
    nll = -lp.gather(1, targets[:, None]).squeeze(1)
    ref_nll = -ref_lp.gather(1, targets[:, None]).squeeze(1)
    kl = (ref_lp.exp() * (ref_lp - lp)).sum(-1).clamp(min=0)
    top1 = (ref_lp.argmax(-1) == lp.argmax(-1)).float()
    return {
        "tokens": int(lp.shape[0]),
        "perplexity": float(nll.mean().exp()),
        "ref_perplexity": float(ref_nll.mean().exp()),
        "kl_mean": float(kl.mean()),
        "kl_p99": float(torch.quantile(kl, 0.99)),
        "kl_max": float(kl.max()),
        "top1_agreement": float(top1.mean()),
    }


def _ref_path(model_name: str, ids: list[int]) -> Path:
    from engine.common.paths import cache_dir

    h = hashlib.sha256(repr((model_name, ids)).encode()).hexdigest()[:16]
    return cache_dir() / "quality" / f"{model_name.replace('/', '_')}-{h}.safetensors"


def has_reference(lm, max_tokens: int = 512) -> bool:
    """Whether the fp32 reference for this model and eval length is already cached."""
    return _ref_path(lm.name, eval_ids(lm.tokenizer, max_tokens)).exists()


def reference_logprobs(model_name: str, ids: list[int], ref_lm=None, progress=None) -> torch.Tensor:
    """fp32 log-probs for the eval text, computed once and cached on disk."""
    from safetensors.torch import load_file, save_file

    p = _ref_path(model_name, ids)
    if p.exists():
        try:
            return load_file(str(p))["logprobs"]
        except Exception:
            p.unlink(missing_ok=True)  # a torn write: recompute
    if ref_lm is None:
        from engine.infer.loader import load

        (progress or (lambda s: None))(f"computing the fp32 reference for {model_name} (once)")
        ref_lm = load(model_name, "fp32", "cpu", progress)
    lp = logprobs(ref_lm, ids)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    save_file({"logprobs": lp.contiguous()}, str(tmp))
    tmp.replace(p)
    return lp


def evaluate(lm, max_tokens: int = 512, ref_lm=None, progress=None) -> dict:
    ids = eval_ids(lm.tokenizer, max_tokens)
    ref = reference_logprobs(lm.name, ids, ref_lm=ref_lm if ref_lm is not None else
                             (lm if lm.spec.precision == "fp32" else None), progress=progress)
    out = compare(ref, logprobs(lm, ids), ids)
    out["eval_text"] = EVAL_TEXT.name
    return out
