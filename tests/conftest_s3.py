"""An S3-compatible server on loopback for the bucket store's tests (moto's server mode).

One server per test process, started on first use and stopped at exit; each test
gets its own prefix in one bucket, so tests never see each other's objects.
"""

from __future__ import annotations

import atexit
import logging
import uuid
from typing import Any

BUCKET = "somatize-tests"

_server: dict[str, Any] = {}


def s3_options() -> dict[str, Any]:
    """Storage options that reach the loopback server (started on first call)."""
    if "url" not in _server:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        _server["url"] = f"http://{host}:{port}"
        atexit.register(server.stop)
        import s3fs

        s3fs.S3FileSystem(**_options()).mkdir(BUCKET)
    return _options()


def _options() -> dict[str, Any]:
    return {"key": "x", "secret": "x", "client_kwargs": {"endpoint_url": _server["url"]}}


def s3_url() -> str:
    """A fresh prefix in the test bucket."""
    s3_options()
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"
