"""Acceptance statistics of speculative decoding, with vLLM's definitions written down.

The stats object only counts; sinks (the run record, the server's /metrics) read it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from engine.common.formulas import expected_length


@dataclass
class SpecStats:
    """Per-request acceptance statistics.

    drafted/accepted: draft tokens proposed and kept, summed over sequences and rounds.
    acceptance_rate: accepted / drafted.
    mean_acceptance_length: tokens emitted per target verification pass, counting the bonus/resample
      token (vLLM's definition: 1 + accepted / rounds), per sequence.
    position_rate[i]: share of rounds in which draft position i (0-based) was accepted, of those
      in which it was proposed.
    expected_length: (1 - a^(g+1)) / (1 - a) for a = acceptance_rate and g = mean gamma: what an
      i.i.d. acceptance model predicts for mean_acceptance_length.
    draft_s / verify_s: wall time spent drafting and in target verification passes.
    """

    draft_kind: str
    gamma: int
    adaptive: bool
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    position_drafted: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    gamma_history: list[int] = field(default_factory=list)
    accepted_hist: list[int] = field(default_factory=list)  # [j]: rounds that accepted exactly j drafts (vLLM's)
    draft_s: float = 0.0
    verify_s: float = 0.0
    baseline_tok_s: float | None = None
    speedup: float | None = None

    def count_round(self, drafted: int, accepted: int, emitted: int) -> None:
        """One verification round of one sequence: `drafted` draft tokens, the first `accepted` of
        them kept, `emitted` tokens committed (the accepted ones and the target's, unless it finished)."""
        self.rounds += 1
        self.gamma_history.append(drafted)
        self.drafted += drafted
        self.accepted += accepted
        self.emitted += emitted
        for j in range(drafted):
            self.position_drafted[j] += 1
            self.position_accepted[j] += int(j < accepted)
        if accepted < len(self.accepted_hist):
            self.accepted_hist[accepted] += 1

    def add(self, counts: "SpecStats") -> "SpecStats":
        """Add another stats object's counters (one sequence's, infer.batch.Sequence.spec_stats): vLLM's
        counters are sums over sequences and rounds."""
        self.rounds += counts.rounds
        self.drafted += counts.drafted
        self.accepted += counts.accepted
        self.emitted += counts.emitted
        self.gamma_history += counts.gamma_history
        for j, (d, a) in enumerate(zip(counts.position_drafted, counts.position_accepted)):
            self.position_drafted[j] += d
            self.position_accepted[j] += a
        for j, n in enumerate(counts.accepted_hist[:len(self.accepted_hist)]):
            self.accepted_hist[j] += n
        return self

    def to_dict(self) -> dict:
        d = asdict(self)
        a = self.acceptance_rate
        d.update(acceptance_rate=a, mean_acceptance_length=self.mean_acceptance_length,
                 expected_length=self.expected_length, position_rate=self.position_rate,
                 mean_gamma=self.mean_gamma)
        return d

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_gamma(self) -> float:
        return sum(self.gamma_history) / len(self.gamma_history) if self.gamma_history else float(self.gamma)

    @property
    def mean_acceptance_length(self) -> float | None:
        return self.emitted / self.rounds if self.rounds else None

    @property
    def expected_length(self) -> float | None:
        return expected_length(self.acceptance_rate, self.mean_gamma)

    @property
    def position_rate(self) -> list[float | None]:
        return [a / d if d else None for a, d in zip(self.position_accepted, self.position_drafted)]
