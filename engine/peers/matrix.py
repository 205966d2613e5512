"""Which peers to measure: the benchmark's matrix, the Compare page's candidates, and what is installed."""
from __future__ import annotations

import os
from engine.peers.peer import LLAMA_PRECISIONS, OURS, SYSTEMS, PeerConfig, unavailable_reason


def available_systems(device: str = "cpu") -> dict[str, str | None]:
    """System -> None when installed, else the reason (for the dashboard's peer picker)."""
    return {s: unavailable_reason(PeerConfig.of(system=s, precision=("Q4_K_M" if s == "llama.cpp" else "bf16"),
                                                device=device)) for s in SYSTEMS}


def default_peer_configs(model="default", draft_model="default-draft", max_new_tokens=64, reps=3,
                         device="cpu", prompt=None) -> list[PeerConfig]:
    """The benchmark's matrix: each peer the way people run it, and our engine at each precision and draft."""
    base = PeerConfig.of(model=model, draft_model=draft_model, max_new_tokens=max_new_tokens, reps=reps,
                         device=device, prompt=prompt)
    hf, ll, us = "transformers", "llama.cpp", OURS

    def c(system, precision, draft="none", **kw):
        return base.with_fields(system=system, precision=precision, draft=draft, **kw)

    out = [c(hf, "fp32"), c(hf, "bf16"), c(hf, "fp32", "model"), c(hf, "bf16", "model"), c(hf, "fp32", "ngram"),
           c(hf, "llm.int8"), c(hf, "nf4"),
           c(ll, "Q4_K_M"), c(ll, "Q4_K_M", "ngram")]
    out += [c(us, p) for p in ("fp32", "bf16", "int8", "int4")]
    out += [c(us, "int8", "model", draft_precision="int4", gamma=4),
            c(us, "int4", "model", draft_precision="int4", gamma=2),
            c(us, "int8", "self", draft_precision="int4", gamma=4), c(us, "int4", "ngram", gamma=4),
            c(us, "int8", "ngram", gamma=4)]
    # Our rows run int8 activations in the int4 kernels (the engine's default, as llama.cpp quantizes its own
    # to 8 bits); these run fp32 activations, labelled "fp32 act".
    out += [c(us, "int4", act="fp32"), c(us, "int4", "model", draft_precision="int4", gamma=3),
            c(us, "int4", "model", draft_precision="int4", gamma=3, act="fp32")]
    return out


# ---------------------------------------------------------------- the parent side


def _peer_candidates(base: PeerConfig) -> list[PeerConfig]:
    """The peer rows the Compare page offers, in its order."""
    cands = [base.with_fields(system="transformers", precision=p) for p in ("fp32", "bf16", "llm.int8", "nf4")]
    cands += [base.with_fields(system="transformers", precision="fp32", draft="model"),
              base.with_fields(system="transformers", precision="fp32", draft="ngram"),
              base.with_fields(system="llama.cpp", precision="Q4_K_M"),
              base.with_fields(system="llama.cpp", precision="Q4_K_M", draft="ngram")]
    # llama.cpp's own quantizations of the same weights (built on first use: minutes for the 1.5B)
    return cands + [base.with_fields(system="llama.cpp", precision=p) for p in LLAMA_PRECISIONS if p != "Q4_K_M"]


def peer_key(cfg: PeerConfig) -> str:
    """A peer row's name whatever the model: 'llama.cpp Q4_K_M', 'transformers fp32 +ngram'."""
    d = cfg.setup.draft
    return f"{cfg.system} {cfg.setup.precision}" + (f" +{d}" if d != "none" else "")


def peer_availability(device: str = "cpu") -> dict[str, str | None]:
    """Each peer row the Compare page offers -> None when it can run on this machine, else why (what a backend's
    /v1/info reports, so a dashboard elsewhere offers what the backend's machine has)."""
    return {peer_key(c): unavailable_reason(c) for c in _peer_candidates(PeerConfig.of(device=device))}


def dashboard_peer_configs(model: str, draft_model: str, max_new_tokens: int, device: str = "cpu",
                           reps: int = 1, reported: dict[str, str | None] | None = None
                           ) -> tuple[list[PeerConfig], dict[str, str]]:
    """Peer rows the Compare page offers for this model: (installed configs, {label: why not} for the rest).
    `reported`: the backend's peer_availability() (its /v1/info), which says what its machine has; without it,
    this machine is asked."""
    from engine.infer import catalog
    cname = catalog.canonical_name(model)
    base = PeerConfig.of(model=model, draft_model=draft_model, max_new_tokens=max(2, int(max_new_tokens)),
                         reps=reps, device=device)
    ok, missing = [], {}
    for c in _peer_candidates(base):
        if reported is None:
            why = unavailable_reason(c)
        else:
            why = reported.get(peer_key(c), "the backend does not report this peer: restart it from this checkout")
        if why is None and c.system == "llama.cpp" and cname not in catalog.CATALOG:
            why = "llama.cpp runs the catalog models' GGUF files; this model has none"
        if why is None and cname not in catalog.CATALOG and not os.path.isdir(model):
            why = "peers load models from disk; pick a catalog model or a local folder"
        if why is None:
            ok.append(c)
        else:
            missing[c.label] = why
    return ok, missing
