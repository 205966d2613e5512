"""The real server in a test: `python -m engine serve`'s app and engine loop, wired as the CLI wires them
(cli.build + create_app), under uvicorn on 127.0.0.1 in a thread, stopped when the context ends."""
from __future__ import annotations

import argparse
import contextlib
import socket
import threading
import time


@contextlib.contextmanager
def served(*serve_args: str, on_server=None):
    """Yields Namespace(url, model, loop, server, thread) for `serve *serve_args`; on_server(loop, uvicorn_server) runs
    before the server starts (the failure tests wire the CLI's stop-on-death there)."""
    import uvicorn

    from engine.serve import cli
    from engine.serve.app import create_app

    p = argparse.ArgumentParser()
    cli.add_parser(p.add_subparsers())
    loop, name, facts = cli.build(p.parse_args(["serve", *serve_args]))
    loop.start()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    srv = uvicorn.Server(uvicorn.Config(create_app(loop, name, facts), host="127.0.0.1", log_level="warning",
                                        lifespan="off"))
    if on_server is not None:
        on_server(loop, srv)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not srv.started:
            assert thread.is_alive(), "the server thread ended before it started serving"
            time.sleep(0.05)
        yield argparse.Namespace(url=f"http://127.0.0.1:{sock.getsockname()[1]}", model=name, loop=loop, server=srv,
                                 thread=thread)
    finally:
        srv.should_exit = True
        thread.join(15)
        loop.stop()
        sock.close()
