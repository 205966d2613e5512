"""The engine setup: which model, at which precision, with which draft, at which γ. Declared once.

Every producer of a run holds one `EngineSetup`: a measured run (measure.RunConfig), a peer
(peers.PeerConfig), a server the lab starts (peers.ServerSpec), `python -m engine serve` and the
dashboard's backend. Its `label` is the one name a configuration has in every table, its
`headroom` the KV positions speculation needs past the tokens, and `to_record()` what a record
keeps of it. Pure (no torch): the pages and the backend client build setups without the engine.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from engine.common.errors import UserError, read_object
from engine.common.vocab import (GROUP_SIZES, MAX_GAMMA, QUANT_METHODS, WEIGHT_BITS, check_draft_kind,
                                 check_spec_policy, method_words, parse_precision, parse_precision_spec,
                                 precision_token)

NO_DRAFT = "none"
LOADED_DRAFTS = ("model", "self")  # draft kinds that load a second model


@dataclass(frozen=True)
class EngineSetup:
    model: str = "default"
    precision: str = "fp32"  # may carry the method and group on input: 'int4-gptq-g32' (validate splits it)
    group_size: int = 64  # int4 groups (both target and draft)
    method: str = "rtn"  # how the target's int4 grid is chosen: rtn | gptq | awq (vocab.QUANT_METHODS)
    quantize_embeddings: bool = False
    quantize_head: bool = True
    device: str = "auto"  # cpu, cuda, cuda:N or auto
    draft: str = NO_DRAFT  # none | model | self | ngram
    draft_model: str = "default-draft"  # draft == "model" only
    draft_precision: str = "int4"  # draft in ("model", "self")
    gamma: int = 4  # draft tokens per round (the most, under the adaptive policy)
    adaptive_gamma: bool = False  # the static benchmarks' heuristic: +2 after a fully accepted round, -1 otherwise
    spec_policy: str = "fixed"  # a server's draft length per step: fixed | adaptive (by step cost) | off (no draft)

    def validate(self) -> "EngineSetup":
        """This setup with canonical precision names; a UserError names the first bad field and the fix."""
        if not isinstance(self.model, str) or not self.model.strip():
            raise UserError("the setup names no model",
                            "give a catalog name (default, default-draft), a folder or a hub id")
        if isinstance(self.group_size, bool) or self.group_size not in GROUP_SIZES:
            raise UserError(f"int4 group size {self.group_size!r} is not supported",
                            f"use one of: {', '.join(map(str, GROUP_SIZES))}")
        precision, method, group_size = parse_precision_spec(self.precision, self.group_size)
        if self.method not in QUANT_METHODS:
            raise UserError(f"unknown quantization method {self.method!r}", f"use one of: {', '.join(QUANT_METHODS)}")
        if method == "rtn" and self.method != "rtn":  # the method came as its own field
            if precision != "int4":
                raise UserError(f"quantization method {self.method!r} is for int4 only, not {precision}",
                                f"use precision int4 with method {self.method}, or method rtn")
            method = self.method
        check_draft_kind(self.draft)
        check_spec_policy(self.spec_policy)
        if self.spec_policy == "off" and self.draft != NO_DRAFT:  # nothing drafts: the label and record say so
            return replace(self, draft=NO_DRAFT, spec_policy="fixed", adaptive_gamma=False).validate()
        if self.draft == NO_DRAFT and self.spec_policy != "fixed":  # no draft: no policy to name
            return replace(self, spec_policy="fixed").validate()
        if self.adaptive_gamma and self.spec_policy == "adaptive":
            raise UserError("adaptive_gamma (the benchmarks' +2/-1 heuristic) and the adaptive speculation policy "
                            "both pick gamma", "use one: spec_policy adaptive for a server, adaptive_gamma for bench")
        draft_precision = parse_precision(self.draft_precision) if self.draft in LOADED_DRAFTS else self.draft_precision
        if self.draft != NO_DRAFT and (isinstance(self.gamma, bool) or not isinstance(self.gamma, int)
                                       or not 1 <= self.gamma <= MAX_GAMMA):
            raise UserError(f"gamma {self.gamma!r} is out of range", f"use 1 to {MAX_GAMMA} draft tokens per round")
        if self.draft == "self" and WEIGHT_BITS[draft_precision] >= WEIGHT_BITS[precision]:
            what = "is the target itself: it accepts every token and saves nothing" if draft_precision == precision \
                else f"reads as many bytes per step as the {precision} target, so drafting costs what it saves"
            raise UserError(f"a self-draft at {draft_precision} {what}",
                            "draft at a cheaper precision than the target (int4 drafting int8 or bf16, say)")
        if self.draft == "model" and not (isinstance(self.draft_model, str) and self.draft_model.strip()):
            raise UserError("a model draft names no draft model", "give --draft-model (default-draft is the 0.5B)")
        return replace(self, precision=precision, method=method, group_size=group_size,
                       draft_precision=draft_precision)

    @property
    def speculative(self) -> bool:
        return self.draft != NO_DRAFT

    @property
    def headroom(self) -> int:
        """KV positions past the tokens that speculation writes: a verification scores gamma + 1 rows."""
        return self.gamma + 1 if self.speculative else 0

    @property
    def draft_model_name(self) -> str | None:
        """The model the draft loads: the draft model, the target itself for a self-draft, else None."""
        return {"model": self.draft_model, "self": self.model}.get(self.draft)

    @property
    def precision_label(self) -> str:
        return self.precision + method_words(self.precision, self.method) \
            + (f" g{self.group_size}" if self.precision == "int4" and self.group_size != 64 else "")

    @property
    def precision_token(self) -> str:
        """The target's precision as input takes it, method and group included: 'int4-gptq-g32', 'int8'."""
        return precision_token(self.precision, self.method, self.group_size)

    @property
    def draft_label(self) -> str:
        """'' without a draft; ' + default-draft@int4 g=4', ' + self@int4 g=4' or ' + ngram g=4'."""
        if not self.speculative:
            return ""
        who = {"model": f"{self.draft_model}@{self.draft_precision}", "self": f"self@{self.draft_precision}"}
        g = f"g<={self.gamma} cost-adaptive" if self.spec_policy == "adaptive" else f"g={self.gamma}"
        return f" + {who.get(self.draft, self.draft)} {g}" + (" adaptive" if self.adaptive_gamma else "")

    @property
    def label(self) -> str:
        """The one name of this configuration: 'default@int4 + default-draft@int4 g=4'."""
        return f"{self.model}@{self.precision_label}{self.draft_label}"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "EngineSetup":
        """A setup from its dict (unknown keys refused by name, so a typo never becomes a default)."""
        return cls(**read_object(d, "setup", {f.name for f in fields(cls)}, "send the fields of EngineSetup"))

    def to_record(self) -> dict:
        """What a record keeps: the target's fields, and the draft as one object (None without one)."""
        draft = None
        if self.speculative:
            draft = {"kind": self.draft, "model": self.draft_model_name if self.draft == "model" else None,
                     "precision": self.draft_precision if self.draft in LOADED_DRAFTS else None,
                     "gamma": self.gamma, "adaptive": self.adaptive_gamma, "policy": self.spec_policy}
        return {"model": self.model, "precision": self.precision, "method": self.method, "group_size": self.group_size,
                "quantize_embeddings": self.quantize_embeddings, "quantize_head": self.quantize_head,
                "draft": draft}
