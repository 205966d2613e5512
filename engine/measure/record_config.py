"""A run record's config, typed: the setup it ran, and the workload, sampling, batch and kernel settings.

`RecordConfig.to_dict()` is what goes in `RunRecord.config`. Besides `setup` (the EngineSetup) and
`run_config` (RunConfig.to_dict(), to measure the record again), it keeps the flat keys stored
records have always had and their readers use: `model`, `precision` (the loaded label, 'int4-g64'),
`quant`, `device` (the device it ran on), `batch_size` and `draft` (EngineSetup.to_record()'s), and
`architecture` (the family and the features beyond Llama that ran; which path ran is record.kernels) and
`calibration` (a calibrated int4's algorithm version and text: record_setup.stale_calibration).
`from_record` reads a stored record of any readable schema. Pure (no torch).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from engine.common.record_setup import setup_from_record
from engine.common.setup import EngineSetup


@dataclass(frozen=True)
class RecordConfig:
    setup: EngineSetup
    device: str  # the device it ran on (the setup's may say "auto")
    precision_label: str  # the target as loaded: 'int4-g64', 'fp32'
    quant: dict = field(default_factory=dict)  # the target's QuantSpec as a dict
    workload: str | None = None
    reps: int | None = None
    sampling: dict | None = None  # infer.sampling.SamplingParams.to_dict()
    chat: bool | None = None
    batch_size: int = 1
    max_new_tokens: int | None = None
    batch_settings: dict | None = None  # the scheduler's max_seqs, token budget, policy (infer.scheduler)
    kernel_settings: dict | None = None  # ops.KernelConfig as a dict: ISA cap, fused path, int8 activations
    run_config: dict | None = None  # RunConfig.to_dict(): what "measure again" runs
    architecture: dict | None = None  # ModelConfig.architecture(): family, model_type, features beyond Llama
    calibration: dict | None = None  # the loaded target's calibrate.Calibrated.facts(); None when not calibrated

    def to_dict(self) -> dict:
        return {**self.setup.to_record(), "precision": self.precision_label, "quant": dict(self.quant),
                "device": self.device, "batch_size": self.batch_size, "max_new_tokens": self.max_new_tokens,
                "workload": self.workload, "reps": self.reps, "sampling": self.sampling, "chat": self.chat,
                "batch_settings": self.batch_settings, "kernel_settings": self.kernel_settings,
                "setup": self.setup.to_dict(), "run_config": self.run_config, "architecture": self.architecture,
                "calibration": self.calibration}

    @classmethod
    def from_record(cls, rec) -> "RecordConfig":
        """The config of a stored record (a RunRecord or its dict), whatever readable schema wrote it."""
        c = (rec.get("config") if isinstance(rec, Mapping) else rec.config) or {}
        setup = setup_from_record(c)
        rc = c.get("run_config") if isinstance(c.get("run_config"), Mapping) else None
        sampling = c.get("sampling")
        if sampling is None and rc is not None and "temperature" in rc:
            sampling = {k: rc.get(k) for k in ("temperature", "top_k", "top_p", "seed")}
        return cls(setup=setup, device=str(c.get("device") or setup.device),
                   precision_label=str(c.get("precision") or setup.precision),
                   quant=dict(c.get("quant") or {}), workload=c.get("workload"), reps=c.get("reps"),
                   sampling=sampling, chat=c.get("chat"), batch_size=int(c.get("batch_size") or 1),
                   max_new_tokens=c.get("max_new_tokens"), batch_settings=c.get("batch_settings"),
                   kernel_settings=c.get("kernel_settings"), run_config=dict(rc) if rc is not None else None,
                   architecture=c.get("architecture"),
                   calibration=c.get("calibration") if isinstance(c.get("calibration"), Mapping) else None)
