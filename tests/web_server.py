"""A folder served by a plain web server, as ``python -m http.server`` serves one: it
answers reads, and takes no writes (a PUT is answered 501)."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def served_over_http(folder: Path) -> Iterator[str]:
    """The URL (``http://127.0.0.1:port``) of ``folder`` served while the block runs."""
    handler = functools.partial(_Quiet, directory=folder)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
