"""The sandbox contains what a generated program may do wrong, and says what happened (real subprocesses)."""
import socket
import threading

import pytest

from engine.measure.sandbox import Limits, run

FAST = Limits(timeout_s=3.0)


def test_a_correct_program_passes_and_a_failing_one_says_why():
    assert run("assert sum([1, 2]) == 3\n", FAST).status == "passed"
    out = run("def f():\n    return 1\nassert f() == 2, 'wrong answer'\n", FAST)
    assert out.status == "failed" and "AssertionError: wrong answer" in out.reason


def test_an_infinite_loop_is_killed_at_the_time_limit():
    out = run("while True:\n    pass\n", Limits(timeout_s=1.5))
    assert out.status in ("timeout", "killed") and not out.passed
    assert out.wall_s < 6, "the loop must not outlive the limit"
    assert "1.5 s" in out.reason or "SIGXCPU" in out.reason


def test_a_fork_bomb_stand_in_is_bounded_and_its_children_killed():
    # each process forks forever; the process limit makes forks fail, the timeout ends the rest
    prog = ("import os, time\n"
            "kids = 0\n"
            "while True:\n"
            "    pid = os.fork()\n"
            "    if pid == 0:\n"
            "        time.sleep(60)\n"
            "        os._exit(0)\n"
            "    kids += 1\n")
    out = run(prog, Limits(timeout_s=3.0, processes=8))
    assert out.status == "processes", out
    assert "limit of 8 processes" in out.reason
    import subprocess
    left = subprocess.run(["pgrep", "-u", "65534", "-f", "program.py"], capture_output=True, text=True).stdout
    assert not left.strip(), f"sandboxed children outlived the run: {left}"


def test_a_large_allocation_hits_the_memory_limit():
    out = run("x = bytearray(2 << 30)\n", Limits(timeout_s=5.0, memory_bytes=256 << 20))
    assert out.status == "memory" and "256 MiB" in out.reason


def test_the_network_is_unreachable_even_on_loopback():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    got = []
    threading.Thread(target=lambda: got.append(srv.accept()), daemon=True).start()
    prog = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
    out = run(prog, FAST)
    srv.close()
    assert out.status == "failed" and not got, "the program reached the lab's loopback"
    assert "Error" in out.reason  # e.g. ConnectionRefusedError / OSError: Network is unreachable


def test_bad_limits_are_refused():
    from engine.common.errors import UserError

    with pytest.raises(UserError, match="timeout_s > 0"):
        run("pass\n", Limits(timeout_s=0))


def test_the_unprivileged_path_contains_the_same_four():
    """Run by a user who is not root (here: root dropping to nobody to run this module's checks), the
    sandbox isolates with a user namespace instead of setpriv: the loop, the fork bomb stand-in, the large
    allocation and the network attempt are each contained there too."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("this machine runs the tests unprivileged: the tests above already took that path")
    root = Path(__file__).resolve().parent.parent
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "from engine.measure import sandbox\n"
            "from engine.measure.sandbox import Limits, run\n"
            "print(sandbox.isolation())\n"
            "fork = ('import os, time\\nwhile True:\\n    if os.fork() == 0:\\n'\n"
            "        '        time.sleep(60)\\n        os._exit(0)\\n')\n"
            "for prog, lim in (('while True:\\n    pass\\n', Limits(timeout_s=1.5)),\n"
            "                  (fork, Limits(timeout_s=3.0, processes=8)),\n"
            "                  ('x = bytearray(2 << 30)\\n', Limits(timeout_s=5.0, memory_bytes=256 << 20)),\n"
            "                  ('import socket\\nsocket.create_connection((\"127.0.0.1\", 9), timeout=2)\\n',\n"
            "                   Limits(timeout_s=3.0))):\n"
            "    out = run(prog, lim)\n"
            "    print(out.status, '|', out.reason)\n")
    p = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-c", code,
                        str(root)], capture_output=True, text=True, timeout=120, cwd="/tmp")
    if p.returncode != 0 and ("Permission denied" in p.stderr or "user namespaces" in p.stderr):
        pytest.skip(f"nobody cannot run this checkout's python or make a user namespace here: {p.stderr[-300:]}")
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.split("\n")
    status = [x.split(" | ")[0] for x in lines[1:5]]
    assert "in a user namespace" in lines[0] and "fresh network namespace" in lines[0]
    assert status[0] in ("timeout", "killed") and status[1:] == ["processes", "memory", "failed"], p.stdout
    assert "Network is unreachable" in lines[4], p.stdout  # no loopback in the namespace: not even "refused"
