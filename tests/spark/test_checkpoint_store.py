"""The ``jetstream://`` file system Spark checkpoints to (dev.spanflow.state in the jar),
driven through Hadoop's API on a real NATS server: whole files or none, atomic renames,
copies for savepoints, a clear error for a damaged file, patience through a restart."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from typing import Any

import pytest
from py4j.protocol import Py4JJavaError

from spanflow.nats import EmbeddedNats
from spanflow.nats.streams import connect
from spanflow.spark.checkpoints import checkpoint_store
from spanflow.spark.checkpoints.source_names import offset_log_version

CHUNK = 64 * 1024


@pytest.fixture
def store(spark: Any, nats_url: str, uid: str) -> Any:
    """A fresh store (its own stream) with small chunks, so files span several."""
    checkpoint_store.configure(spark, nats_url)
    conf = spark._jsc.hadoopConfiguration()
    conf.set("fs.jetstream.chunk.bytes", str(CHUNK))
    path = spark._jvm.org.apache.hadoop.fs.Path(f"jetstream://s{uid}/")
    fs = path.getFileSystem(conf)
    conf.unset("fs.jetstream.chunk.bytes")
    return fs


def _path(spark: Any, url: str) -> Any:
    return spark._jvm.org.apache.hadoop.fs.Path(url)


def _write(spark: Any, fs: Any, url: str, data: bytes, overwrite: bool = True) -> None:
    out = fs.create(_path(spark, url), overwrite)
    out.write(bytearray(data))
    out.close()


def _read(spark: Any, fs: Any, url: str) -> bytes:
    stream = fs.open(_path(spark, url))
    try:
        return bytes(spark._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
    finally:
        stream.close()


def _names(spark: Any, fs: Any, url: str) -> set[str]:
    return {str(s.getPath().getName()) for s in fs.listStatus(_path(spark, url))}


def test_files_directories_and_renames(spark, store, uid):
    root = f"jetstream://s{uid}"
    data = bytes(range(256)) * 1000  # 256,000 bytes: four chunks
    _write(spark, store, f"{root}/q/offsets/.0.tmp", data)
    assert store.getFileStatus(_path(spark, f"{root}/q/offsets/.0.tmp")).getLen() == len(data)
    assert store.getFileStatus(_path(spark, f"{root}/q")).isDirectory()
    assert _names(spark, store, f"{root}/q") == {"offsets"}

    # rename: atomic, onto a new name; a second rename onto an existing file replaces it
    assert store.rename(
        _path(spark, f"{root}/q/offsets/.0.tmp"), _path(spark, f"{root}/q/offsets/0")
    )
    assert _names(spark, store, f"{root}/q/offsets") == {"0"}
    assert _read(spark, store, f"{root}/q/offsets/0") == data
    _write(spark, store, f"{root}/q/offsets/.0.again", b"second")
    assert store.rename(
        _path(spark, f"{root}/q/offsets/.0.again"), _path(spark, f"{root}/q/offsets/0")
    )
    assert _read(spark, store, f"{root}/q/offsets/0") == b"second"

    # create without overwrite refuses an existing file
    with pytest.raises(Py4JJavaError, match="already exists"):
        _write(spark, store, f"{root}/q/offsets/0", b"x", overwrite=False)

    # names that are not NATS tokens: dots, spaces, wildcards, non-ASCII
    odd = f"{root}/q/state/0/.1.delta.a b*>é.tmp"
    _write(spark, store, odd, b"odd")
    assert _names(spark, store, f"{root}/q/state/0") == {".1.delta.a b*>é.tmp"}
    assert store.mkdirs(_path(spark, f"{root}/q/empty"))
    assert _names(spark, store, f"{root}/q") == {"offsets", "state", "empty"}

    with pytest.raises(Py4JJavaError, match="PathIsNotEmptyDirectory"):
        store.delete(_path(spark, f"{root}/q"), False)
    assert store.delete(_path(spark, f"{root}/q"), True)
    assert not store.exists(_path(spark, f"{root}/q/offsets/0"))
    assert not store.exists(_path(spark, f"{root}/q"))


def test_savepoint_copies_between_local_disk_and_the_store(spark, store, uid, tmp_path):
    local = tmp_path / "checkpoint"
    (local / "offsets").mkdir(parents=True)
    (local / "offsets" / "0").write_text("v1\n{}")
    (local / "state" / "0" / "0").mkdir(parents=True)
    (local / "state" / "0" / "0" / "1.zip").write_bytes(bytes(300_000))
    saved = f"jetstream://s{uid}/savepoints/p/f1"
    moved = f"jetstream://s{uid}/checkpoints/p/f1"
    back = tmp_path / "back"

    assert checkpoint_store.copy(spark, str(local), saved)
    assert checkpoint_store.copy(spark, saved, moved)  # store to store: a move's restore
    assert checkpoint_store.copy(spark, moved, str(back))
    assert (back / "offsets" / "0").read_text() == "v1\n{}"
    assert (back / "state" / "0" / "0" / "1.zip").read_bytes() == bytes(300_000)
    assert checkpoint_store.exists(spark, saved)
    assert not checkpoint_store.copy(spark, f"jetstream://s{uid}/nothing", str(back))
    checkpoint_store.remove(spark, saved)
    assert not checkpoint_store.exists(spark, saved)
    assert checkpoint_store.exists(spark, moved)  # a copy, not a shared reference

    # a fragment that never checkpointed saves an empty savepoint; restoring it works
    empty = f"jetstream://s{uid}/savepoints/p/f2"
    checkpoint_store.make_empty(spark, empty)
    assert checkpoint_store.copy(spark, empty, f"jetstream://s{uid}/checkpoints/p/f2")
    assert checkpoint_store.exists(spark, f"jetstream://s{uid}/checkpoints/p/f2")


def test_small_files_and_directories_are_seen_through_every_scheme(spark, store, uid, tmp_path):
    """What a checkpoint's version file needs (spanflow.spark.checkpoints.versions): a directory's
    existence, and a small file written, replaced and read back."""
    for root in (f"jetstream://s{uid}/versions", str(tmp_path / "versions")):
        file = f"{root}/q/spanflow-version.json"
        assert checkpoint_store.read_text(spark, file) is None
        assert not checkpoint_store.exists(spark, f"{root}/q")
        checkpoint_store.write_text(spark, file, '{"name": "é"}')
        checkpoint_store.write_text(spark, f"{root}/q/offsets/0", "v1")
        assert checkpoint_store.exists(spark, f"{root}/q/offsets")  # a directory
        checkpoint_store.write_text(spark, file, '{"name": "ü"}')  # replaced
        assert checkpoint_store.read_text(spark, file) == '{"name": "ü"}'
        # how the query keeps its offsets: the newest entry's first line (batch 10 > 9)
        assert offset_log_version(spark, f"{root}/q") == "v1"
        checkpoint_store.write_text(spark, f"{root}/q/offsets/9", "v1\n{}")
        checkpoint_store.write_text(spark, f"{root}/q/offsets/10", "v2\n{}\nfrom_a:{}")
        assert checkpoint_store.names(spark, f"{root}/q/offsets") == ["0", "10", "9"]
        assert offset_log_version(spark, f"{root}/q") == "v2"
        assert offset_log_version(spark, f"{root}/new") is None


def _stream_messages(url: str, stream: str) -> dict[str, int]:
    """Last sequence of each subject of a store's stream."""

    async def go() -> dict[str, int]:
        nc = await connect(url)
        try:
            answer = await nc.request(
                f"$JS.API.STREAM.INFO.{stream}",
                json.dumps({"subjects_filter": ">"}).encode(),
                timeout=5,
            )
            return dict(json.loads(answer.data)["state"]["subjects"])
        finally:
            await nc.close()

    return asyncio.run(go())


def _js_call(url: str, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        nc = await connect(url)
        try:
            answer = await nc.request(subject, json.dumps(body).encode(), timeout=5)
            return dict(json.loads(answer.data))
        finally:
            await nc.close()

    return asyncio.run(go())


def test_a_damaged_file_is_an_error_naming_it(spark, store, nats_url, uid):
    stream = f"SPANFLOW_FS_s{uid}"
    url = f"jetstream://s{uid}/frag-7/state/0/0/2.changelog"
    _write(spark, store, url, bytes(200_000))
    meta_subject = next(s for s in _stream_messages(nats_url, stream) if s.endswith("changelog"))
    meta = _js_call(nats_url, f"$JS.API.STREAM.MSG.GET.{stream}", {"last_by_subj": meta_subject})
    doc = json.loads(base64.b64decode(meta["message"]["data"]))

    # a chunk removed behind the store's back
    gone = _js_call(
        nats_url, f"$JS.API.STREAM.MSG.DELETE.{stream}", {"seq": doc["seqs"][1], "no_erase": True}
    )
    assert gone.get("success"), gone
    with pytest.raises(Py4JJavaError) as missing:
        _read(spark, store, url)
    text = str(missing.value)
    assert url in text and "chunk 2 of 4" in text and "missing" in text

    # metadata that no longer matches the bytes
    _write(spark, store, url, bytes(200_000))
    meta = _js_call(nats_url, f"$JS.API.STREAM.MSG.GET.{stream}", {"last_by_subj": meta_subject})
    doc = json.loads(base64.b64decode(meta["message"]["data"]))
    doc["crcs"][0] = doc["crcs"][0] ^ 1

    async def tamper() -> None:
        nc = await connect(nats_url)
        await nc.jetstream().publish(meta_subject, json.dumps(doc).encode())
        await nc.close()

    asyncio.run(tamper())
    with pytest.raises(Py4JJavaError) as altered:
        _read(spark, store, url)
    assert url in str(altered.value) and "checksum" in str(altered.value)


def test_writes_wait_through_a_server_restart(spark, tmp_path, uid):
    """The store's server restarts while a file is written: the write waits for it
    (reconnects, publishes again) and the file is whole; nothing is half there."""
    server = EmbeddedNats(tmp_path / "nats", port=_free_port())
    server.start()
    done = threading.Event()
    try:
        conf = spark._jsc.hadoopConfiguration()
        conf.set(f"fs.jetstream.r{uid}.servers", server.url)
        conf.set("fs.jetstream.chunk.bytes", str(CHUNK))
        url = f"jetstream://r{uid}/frag/offsets/5"
        fs = _path(spark, url).getFileSystem(conf)
        conf.unset("fs.jetstream.chunk.bytes")
        _write(spark, fs, f"jetstream://r{uid}/frag/offsets/4", b"before")

        out = fs.create(_path(spark, url), True)
        out.write(bytearray(bytes(range(256)) * 512))  # two chunks sent
        server.stop()
        restarted = threading.Event()

        def restart() -> None:
            time.sleep(2)  # the outage
            server.start()
            restarted.set()
            # the server dies with the thread that started it (PR_SET_PDEATHSIG)
            done.wait(60)

        threading.Thread(target=restart, daemon=True).start()
        out.write(bytearray(bytes(range(256)) * 512))  # two more, while the server is down
        out.close()
        assert restarted.is_set()
        assert _read(spark, fs, url) == (bytes(range(256)) * 512) * 2
        assert _read(spark, fs, f"jetstream://r{uid}/frag/offsets/4") == b"before"
    finally:
        done.set()
        server.stop()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_reads_fall_back_to_the_leader_when_direct_reads_are_off(spark, store, nats_url, uid):
    """Chunks are read with Direct Get (raw bytes, any replica); a stream that does not
    allow it (made by an older spanflow, or changed by hand) is read through the leader."""
    url = f"jetstream://s{uid}/q/state/1.zip"
    data = bytes(range(256)) * 700  # three chunks
    _write(spark, store, url, data)

    async def direct(allow: bool) -> None:
        nc = await connect(nats_url)
        js = nc.jetstream()
        config = (await js.stream_info(f"SPANFLOW_FS_s{uid}")).config
        config.allow_direct = allow
        await js.update_stream(config)
        await nc.close()

    asyncio.run(direct(False))
    assert _read(spark, store, url) == data
    asyncio.run(direct(True))
    assert _read(spark, store, url) == data
