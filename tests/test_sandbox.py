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
