"""A full S3 server on this machine, for tests of ``s3a://`` checkpoints: Ceph's RADOS
Gateway over a one-monitor, one-OSD Ceph cluster whose OSD keeps objects in memory.

Why not rclone's ``serve s3`` (``spanflow.local.s3``): it maps keys to a folder tree, so
once ``ck/`` exists a HEAD of ``ck`` answers 200 and Hadoop's S3A takes the directory
for a file. RGW is an S3 implementation in production use (keys are keys, SigV4
enforced, conditional puts), so what S3A does against it is what it does against S3.

Debian's ``ceph-mon``, ``ceph-osd`` and ``radosgw`` packages (the project's set-up
installs them); cephx is off (one machine, loopback only); everything lives in a
temporary folder and goes when the server stops. It starts in about 15 s.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from spanflow.errors import SpanflowError
from spanflow.local.s3 import make_bucket
from spanflow.local.server import ProcessServer, free_port

PROGRAMS = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "monmaptool", "ceph")


class CephError(SpanflowError):
    code = "ceph_s3"


def _program(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/bin:/usr/sbin:/sbin")
    if not found:
        raise CephError(f"no {name} here: apt-get install ceph-mon ceph-osd radosgw")
    return found


class LocalCephS3(ProcessServer):
    """RGW on 127.0.0.1 with one user (``access_key``/``secret_key``); a context manager."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.mon_port = free_port()
        self.access_key = "spanflow" + secrets.token_hex(4)
        self.secret_key = secrets.token_urlsafe(24)
        self._daemons: list[subprocess.Popen[bytes]] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 90.0) -> LocalCephS3:
        for name in PROGRAMS:
            _program(name)
        folder = self._temporary_dir("spanflow-ceph-")
        conf = self._write_conf(folder)
        try:
            self._start_mon(folder, conf)
            self._start_osd(folder, conf, timeout)
            self._launch([_program("radosgw"), "-f", "-c", str(conf), "-n", "client.rgw"],
                         folder / "rgw.out")  # fmt: skip
            self._await_port(timeout, "radosgw", folder / "rgw.log")
            self._create_user(conf, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _write_conf(self, folder: Path) -> Path:
        conf = folder / "ceph.conf"
        settings = {
            "fsid": str(uuid.uuid4()),
            "mon host": f"v2:127.0.0.1:{self.mon_port}",
            "auth cluster required": "none",
            "auth service required": "none",
            "auth client required": "none",
            "ms bind msgr1": "false",
            # without cephx there is no session key: "secure" connections cannot be made
            **{
                f"ms {m} mode": "crc"
                for m in (
                    "cluster",
                    "service",
                    "client",
                    "mon cluster",
                    "mon service",
                    "mon client",
                )
            },
            "osd pool default size": "1",
            "osd pool default min size": "1",
            "osd pool default pg num": "8",
            "mon allow pool size one": "true",
            "mon warn on pool no redundancy": "false",
            "osd objectstore": "memstore",
            "memstore device bytes": str(1 << 30),
            "osd data": str(folder / "osd"),
            "mon data": str(folder / "mon"),
            "run dir": str(folder),
            "log file": str(folder / "$name.log"),
            "admin socket": str(folder / "$name.asok"),
            "keyring": str(folder / "keyring"),
            "rgw frontends": f"beast endpoint=127.0.0.1:{self.port}",
            "rgw data": str(folder / "rgw"),
        }
        conf.write_text("[global]\n" + "".join(f"{k} = {v}\n" for k, v in settings.items()))
        for sub in ("osd", "mon", "rgw"):
            (folder / sub).mkdir()
        (folder / "keyring").write_text("")
        return conf

    def _run(self, args: list[str], timeout: float = 60.0) -> str:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise CephError(f"{' '.join(args[:3])} failed: {done.stderr.strip()[-800:]}")
        return done.stdout

    def _daemon(self, args: list[str], log: Path) -> None:
        out = open(log, "ab")  # noqa: SIM115
        self._daemons.append(
            subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        )

    def _start_mon(self, folder: Path, conf: Path) -> None:
        fsid = next(
            line.split("=", 1)[1].strip()
            for line in conf.read_text().splitlines()
            if line.startswith("fsid")
        )
        monmap = folder / "monmap"
        self._run([_program("monmaptool"), "--create", "--clobber", "--fsid", fsid, "--addv",
                   "a", f"[v2:127.0.0.1:{self.mon_port}]", str(monmap)])  # fmt: skip
        self._run([_program("ceph-mon"), "-c", str(conf), "--mkfs", "-i", "a", "--monmap",
                   str(monmap)])  # fmt: skip
        self._daemon([_program("ceph-mon"), "-f", "-c", str(conf), "-i", "a"], folder / "mon.out")

    def _start_osd(self, folder: Path, conf: Path, timeout: float) -> None:
        ceph = [_program("ceph"), "-c", str(conf), "--connect-timeout", "20"]
        osd_id = self._run([*ceph, "osd", "create"], timeout).strip()
        self._run([_program("ceph-osd"), "-c", str(conf), "-i", osd_id, "--mkfs"], timeout)
        self._daemon([_program("ceph-osd"), "-f", "-c", str(conf), "-i", osd_id],
                     folder / "osd.out")  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = json.loads(self._run([*ceph, "osd", "stat", "-f", "json"], timeout))
            if int(status.get("num_up_osds", 0)) >= 1:
                return
            time.sleep(0.5)
        raise CephError(f"the OSD did not come up within {timeout:g} s")

    def _create_user(self, conf: Path, timeout: float) -> None:
        self._run([_program("radosgw-admin"), "-c", str(conf), "user", "create",
                   "--uid", "spanflow", "--display-name", "spanflow",
                   "--access-key", self.access_key, "--secret-key", self.secret_key],
                  timeout)  # fmt: skip

    def make_bucket(self, name: str) -> None:
        make_bucket(self.endpoint, self.access_key, self.secret_key, name)

    def stop(self) -> None:
        self._terminate()
        for daemon in reversed(self._daemons):
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait()
        self._daemons.clear()
        super().stop()
