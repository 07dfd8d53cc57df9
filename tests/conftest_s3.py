"""An S3-compatible server on loopback for the bucket store's tests (moto's server mode).

One server per test process, started on first use and stopped at exit; each test
gets its own prefix in one bucket, so tests never see each other's objects.
"""

from __future__ import annotations

import atexit
import json
import logging
import uuid
from pathlib import Path
from typing import Any

from somatize import Store

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


READS = ["s3:GetObject", "s3:ListBucket", "s3:GetBucketLocation", "s3:HeadBucket"]
"""What a user who may only read a bucket may do (the loopback server names looking for a
bucket ``HeadBucket``)."""


def user(actions: list[str]) -> dict[str, Any]:
    """Storage options of a new user of the loopback server who may do only ``actions``;
    the server holds users to what they may do inside ``enable_iam_authentication()``."""
    import boto3

    endpoint = s3_options()["client_kwargs"]["endpoint_url"]
    iam = boto3.client(
        "iam",
        endpoint_url=endpoint,
        aws_access_key_id="x",
        aws_secret_access_key="x",
        region_name="us-east-1",
    )
    name = f"user-{uuid.uuid4().hex[:12]}"
    iam.create_user(UserName=name)
    allowed = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}],
    }
    iam.put_user_policy(UserName=name, PolicyName="only", PolicyDocument=json.dumps(allowed))
    made = iam.create_access_key(UserName=name)["AccessKey"]
    return {
        "key": made["AccessKeyId"],
        "secret": made["SecretAccessKey"],
        "client_kwargs": {"endpoint_url": endpoint},
    }


def writer_and_reader(home: str, folder: Path) -> tuple[Store, Store]:
    """One store opened twice: to write, and ``read_only=True``. ``home`` is ``"bucket"``
    (a fresh prefix on the loopback server) or ``"directory"`` (``folder``)."""
    if home == "bucket":
        url = s3_url()
        return Store.on_bucket(url, **s3_options()), Store.on_bucket(
            url, **s3_options(), read_only=True
        )
    return Store(folder), Store(folder, read_only=True)
