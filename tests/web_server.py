"""A folder served by a plain web server, as ``python -m http.server`` serves one: it
answers reads, and takes no writes (a PUT is answered 501, or as asked: 403 where it
takes none of the client's credentials); reads under the paths asked are refused 403."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar


class _Quiet(SimpleHTTPRequestHandler):
    put_status = HTTPStatus.NOT_IMPLEMENTED
    forbidden_reads: tuple[str, ...] = ()
    read_status = HTTPStatus.FORBIDDEN
    # Of one server: how many refused reads are left; none: every one is refused.
    refusals_left: ClassVar[list[int]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_PUT(self) -> None:
        self.send_error(self.put_status)

    def do_GET(self) -> None:
        if self._forbidden():
            self.send_error(self.read_status)
        else:
            super().do_GET()

    def do_HEAD(self) -> None:
        if self._forbidden():
            self.send_error(self.read_status)
        else:
            super().do_HEAD()

    def _forbidden(self) -> bool:
        if not any(self.path.startswith(prefix) for prefix in self.forbidden_reads):
            return False
        left = self.refusals_left
        if not left:
            return True
        if left[0] == 0:
            return False
        left[0] -= 1
        return True


@contextlib.contextmanager
def served_over_http(
    folder: Path,
    put_status: HTTPStatus = HTTPStatus.NOT_IMPLEMENTED,
    forbidden_reads: tuple[str, ...] = (),
    read_status: HTTPStatus = HTTPStatus.FORBIDDEN,
    refusals: int | None = None,
) -> Iterator[str]:
    """The URL (``http://127.0.0.1:port``) of ``folder`` served while the block runs; a PUT
    is answered ``put_status``, a read of a path starting with one of ``forbidden_reads``
    (``/blobs/``) ``read_status`` (403): the first ``refusals`` such reads, or every one."""
    options = {
        "put_status": put_status,
        "forbidden_reads": forbidden_reads,
        "read_status": read_status,
        "refusals_left": [] if refusals is None else [refusals],
    }
    handler_class = type("_Served", (_Quiet,), options)
    handler = functools.partial(handler_class, directory=folder)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
