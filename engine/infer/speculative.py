"""Speculative generation of a static batch: a proposer drafts, the target verifies, losslessly.

One round per decoding sequence: the proposer drafts g tokens; the target scores [last, d1..dg] in
one pass (g + 1 rows); verification (verify.py) keeps the accepted prefix and adds one target
token. Inside a batch every sequence advances by its own accepted count (batch.py). The output is
distributed exactly as target-only generation; under greedy decoding it is token-identical to it.
"""
from __future__ import annotations

import torch

from engine.common.vocab import DRAFT_KINDS, MAX_GAMMA  # noqa: F401  (the draft vocabulary, re-exported)
from engine.infer.generate import GenerationResult, prepare, run_static
from engine.infer.proposers import (ModelProposer, NgramProposer, ProposerSpec, check_compatible,  # noqa: F401
                                    check_gamma, proposer_spec)
from engine.infer.sampling import SamplingParams
from engine.infer.scheduler import speculation_headroom


@torch.inference_mode()
def generate_speculative(target, proposer: ProposerSpec, prompts, max_new_tokens: int = 64, gamma: int = 4,
                         adaptive: bool = False, sampling: SamplingParams | None = None, on_token=None,
                         chat: bool = True, prompt_ids=None, stop_at_eos: bool = True) -> GenerationResult:
    """Speculative generation; the output is distributed exactly as target-only generation."""
    g = check_gamma(gamma)
    ids, sp = prepare(target, prompts, max_new_tokens, sampling, chat, prompt_ids,
                      extra=speculation_headroom(proposer, g))
    return run_static(target, ids, max_new_tokens, sp, on_token, stop_at_eos, proposer, g, adaptive)
