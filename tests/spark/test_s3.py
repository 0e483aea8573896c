"""The S3 sink against a real S3-compatible server (rclone serve s3): deterministic
objects and a manifest per batch, exactly once across a SIGKILL, clear start errors."""

from __future__ import annotations

import io

import boto3
import orjson
import pyarrow.parquet as pq
import pytest

import spanflow as sf
from spanflow.errors import CompileError
from spanflow.spark.runner import PipelineRunner
from tests.conftest import S3_KEY_ENV, S3_SECRET_ENV
from tests.helpers import publish, wait_for

SCHEMA = {"id": "long", "site": "string", "v": "double"}
CREDENTIALS = {"access_key_env": S3_KEY_ENV, "secret_key_env": S3_SECRET_ENV}


def _client(server):
    return boto3.client(
        "s3", endpoint_url=server.endpoint, region_name="us-east-1",
        aws_access_key_id=server.access_key, aws_secret_access_key=server.secret_key,
    )  # fmt: skip


def committed_rows(server, bucket: str, prefix: str) -> list[dict]:
    """What a reader that trusts the manifests sees: the objects they list."""
    s3 = _client(server)
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/_manifests/").get("Contents", [])
    rows: list[dict] = []
    for item in listed:
        manifest = orjson.loads(s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read())
        for obj in manifest["objects"]:
            body = s3.get_object(Bucket=bucket, Key=obj["key"])["Body"].read()
            if obj["key"].endswith(".parquet"):
                got = pq.read_table(io.BytesIO(body)).to_pylist()
            else:
                got = [orjson.loads(line) for line in body.splitlines()]
            assert len(got) == obj["rows"]
            rows += [{**r, "_key": obj["key"]} for r in got]
    return rows


def test_batches_become_partitioned_objects_and_manifests(spark, nats_url, s3, checkpoints, uid):
    bucket = f"b-{uid}"
    s3.make_bucket(bucket)
    records = [{"id": i, "site": ["a", "b/c"][i % 2], "v": i / 2} for i in range(50)]
    flow = (
        sf.Pipeline(f"s3-{uid}", trigger="0.5s")
        .source(f"S3IN_{uid}", subjects=[f"s3in{uid}.>"], schema=SCHEMA)
        .filter("id % 5 != 0")
        .sink_s3(bucket, endpoint=s3.endpoint, partition_by=["site"], **CREDENTIALS)
    )
    runner = PipelineRunner(spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints)
    runner.start()
    prefix = f"s3-{uid}/{flow.spec().sinks()[0].id}"
    try:
        publish(nats_url, f"S3IN_{uid}", f"s3in{uid}.r", records)
        wait_for(lambda: len(committed_rows(s3, bucket, prefix)) >= 40)
        runner.await_idle()
    finally:
        runner.stop()
    got = committed_rows(s3, bucket, prefix)
    assert sorted(r["id"] for r in got) == [r["id"] for r in records if r["id"] % 5]
    for row in got:  # each row sits in its site's folder, the value escaped
        site = "b%2Fc" if row["site"] == "b/c" else "a"
        assert f"{prefix}/site={site}/batch=" in row["_key"], row


def test_a_missing_bucket_or_wrong_secret_is_one_clear_error_at_start(
    spark, nats_url, s3, checkpoints, uid, monkeypatch
):
    def start(bucket: str, **options) -> None:
        flow = (
            sf.Pipeline(f"s3e-{uid}")
            .source(f"S3E_{uid}", subjects=[f"s3e{uid}"], schema=SCHEMA)
            .sink_s3(bucket, endpoint=s3.endpoint, **options)
        )
        PipelineRunner(spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints).start()

    with pytest.raises(CompileError, match=rf"s3 bucket 'nope-{uid}' .*(404|Not Found)"):
        start(f"nope-{uid}", **CREDENTIALS)
    s3.make_bucket(f"ok-{uid}")
    monkeypatch.setenv("WRONG_SECRET", "not-it")
    with pytest.raises(CompileError, match=r"(403|Forbidden|SignatureDoesNotMatch)"):
        start(f"ok-{uid}", access_key_env=S3_KEY_ENV, secret_key_env="WRONG_SECRET")
    with pytest.raises(CompileError, match=r"\$NOT_SET_HERE is not set"):
        start(f"ok-{uid}", access_key_env="NOT_SET_HERE", secret_key_env=S3_SECRET_ENV)
    with pytest.raises(CompileError, match=r"partition_by \['nope'\]"):
        start(f"ok-{uid}", partition_by=["nope"], **CREDENTIALS)
