"""GPTQ by llm-compressor, the ecosystem's tool: `int4-gptq-llmc[-gN]`.

The lab's own GPTQ (`int4-gptq`) and llm-compressor's `oneshot` part on the same model (docs/MODELS.md: on the 0.5B
its codes read better than ours, on the 1.5B's off-grid reference worse), so a user who quantizes with
llm-compressor is measured with llm-compressor. It runs in a venv of its own (`make llmc`: its transformers pin
clashes with the lab's), on the lab's calibration documents (engine/infer/calibrate.py: workload text, never the
eval text), in the scheme our kernels run (llmc_driver.py). What it saves is a compressed-tensors pack-quantized
checkpoint, what vLLM serves: kept in the cache entry (`checkpoint/`) and read into our int4 codes as stored
(checkpoints.unpack_checkpoint), never requantized.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections import deque
from pathlib import Path

from engine.common.errors import UserError
from engine.common.paths import REPO_ROOT
from engine.common.processes import stop_group

VENV = REPO_ROOT / ".venv-llmc"
VERSION = "0.14.0.1"  # the llmcompressor `make llmc` installs
DRIVER = Path(__file__).with_name("llmc_driver.py")
FIX = (f"run `make llmc` (llmcompressor=={VERSION} with the CPU torch, in a venv of its own: its pins clash with the "
       "lab's transformers), or use int4-gptq (the lab's own GPTQ)")


def python() -> Path:
    """The venv's interpreter (SCL_LLMC_PYTHON overrides it)."""
    return Path(os.environ.get("SCL_LLMC_PYTHON") or VENV / "bin" / "python")


def unavailable_reason() -> str | None:
    """Why int4-gptq-llmc cannot calibrate here, or None."""
    if not python().exists():
        return f"llm-compressor is not installed (no {python()})"
    return None


def run_oneshot(folder: Path, docs: list[list[int]], group_size: int, quantize_head: bool, out: Path,
                say=None, should_stop=None) -> dict | None:
    """llm-compressor's GPTQ on `folder` into the checkpoint folder `out`; {seconds, tools} from the driver, or None
    when `should_stop()` said so (the process stopped, nothing left at `out`). A failure raises a UserError with
    the end of its output."""
    reason = unavailable_reason()
    if reason:
        raise UserError(f"int4-gptq-llmc: {reason}", FIX)
    say = say or (lambda s: None)
    out.parent.mkdir(parents=True, exist_ok=True)
    job = out.parent / f"{out.name}.job.json"
    job.write_text(json.dumps({"folder": str(folder), "docs": docs, "group_size": group_size,
                               "quantize_head": quantize_head, "out": str(out)}))
    proc = subprocess.Popen([str(python()), str(DRIVER), str(job)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    tail: deque[str] = deque(maxlen=30)
    done: list[dict] = []

    def read():  # tqdm's carriage returns end lines too (universal newlines); its bars may precede our words
        for line in proc.stdout:
            line = line.strip()
            if "SCL_PROGRESS " in line:
                say(f"calibrating with llm-compressor: layer {line.split('SCL_PROGRESS ', 1)[1].split()[0]}")
            elif "SCL_DONE " in line:
                done.append(json.loads(line.split("SCL_DONE ", 1)[1]))
            elif line:
                tail.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while proc.poll() is None:
            if should_stop and should_stop():
                stop_group(proc, grace_s=10)
                return None
            time.sleep(0.2)
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            stop_group(proc, grace_s=10)
        job.unlink(missing_ok=True)
        if not done:
            shutil.rmtree(out, ignore_errors=True)
    if proc.returncode != 0 or not done:
        raise UserError(f"llm-compressor's oneshot failed (exit {proc.returncode}): " + " | ".join(list(tail)[-6:]),
                        f"see the whole output by running {DRIVER.name} in {VENV.name} by hand; or use int4-gptq")
    return done[0]


def read_codes(out: Path) -> tuple[dict, str]:
    """({linear: (packed, scales, mins)} in our format, the scheme in words) of the checkpoint saved at `out`."""
    from safetensors.torch import load_file

    from engine.quant.checkpoints import read_scheme, unpack_checkpoint

    cfg = out / "config.json"
    scheme = read_scheme(json.loads(cfg.read_text()).get("quantization_config") or {}, str(cfg))
    sd: dict = {}
    for f in sorted(out.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    return unpack_checkpoint(sd, scheme)[1], scheme.words
