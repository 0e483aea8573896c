"""Build spanflow's container image (``deploy/Containerfile``) from a clone: ``./dev image``
or ``python -m spanflow.local.image``.

1. The base: Debian bookworm (minbase) made by ``debootstrap`` from Debian's archive and
   imported into podman; its tarball is kept under the data directory
   (``<data dir>/images/``), so a second build, or a test after a build, skips it.
2. The build context: the project's wheel (``pip wheel``) and the jars from Maven
   Central the sessions use (jnats, Spark's Kafka connector, Hadoop's S3A), resolved
   here with the class paths they are recorded under inside the image.
3. ``podman build``: Python and a JRE from Debian, the wheel and its connectors' extras
   from PyPI, Spark's class-data archive made in the image.

Nothing comes from anywhere but Debian's archive, PyPI and Maven Central. Each step's
time is printed (the image test keeps the cost visible).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

from spanflow.local.podman import Podman, PodmanError, why_not
from spanflow.nats.server import default_data_dir

ROOT = Path(__file__).resolve().parents[3]
CONTAINERFILE = ROOT / "deploy" / "Containerfile"
BASE = "localhost/spanflow-base:bookworm"
IMAGE = "localhost/spanflow"
IMAGE_MAVEN = "/opt/spanflow/maven"
DEBIAN_MIRROR = "http://deb.debian.org/debian"


def image_name() -> str:
    return f"{IMAGE}:{version('spanflow')}"


@contextmanager
def step(what: str, say: Callable[[str], None]) -> Iterator[None]:
    started = time.monotonic()
    say(f"{what} …")
    yield
    say(f"{what}: {time.monotonic() - started:.0f} s")


def ensure_base(podman: Podman, cache: Path, say: Callable[[str], None]) -> None:
    """The Debian base image, from the cached tarball or a new debootstrap."""
    if podman.has_image(BASE):
        return
    tarball = cache / "debian-bookworm-minbase.tar"
    if not tarball.exists():
        if shutil.which("debootstrap") is None:
            raise PodmanError("debootstrap not found: apt-get install debootstrap")
        with step("making the Debian base with debootstrap", say):
            _debootstrap(podman, tarball)
    with step(f"importing {tarball.name} as {BASE}", say):
        podman("import", str(tarball), BASE)


def _debootstrap(podman: Podman, tarball: Path) -> None:
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="spanflow-rootfs-", dir=tarball.parent) as tmp:
        root = Path(tmp) / "root"
        podman.command(
            ["debootstrap", "--variant=minbase", "bookworm", str(root), DEBIAN_MIRROR],
            timeout=1800,
        )
        partial = tarball.with_suffix(".partial")
        podman.command(["tar", "-C", str(root), "-cf", str(partial), "."])
        partial.replace(tarball)


def build_context(context: Path, say: Callable[[str], None]) -> None:
    """The wheel and the jars, where the Containerfile copies them from."""
    wheels = context / "wheels"
    leftover = not (ROOT / "build").exists()  # setuptools' build/, removed if it was not here
    with step("building the wheel", say):
        done = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
            capture_output=True,
            text=True,
            check=False,
        )
        if leftover:
            shutil.rmtree(ROOT / "build", ignore_errors=True)
        if done.returncode != 0:
            raise PodmanError(f"pip wheel failed:\n{done.stderr[-2000:]}")
    with step("collecting the jars from Maven Central", say):
        _jars(context / "maven")


def _jars(into: Path) -> None:
    """Each set's jars under ``into/jars``, its class path recorded as the image sees it
    (``SPANFLOW_MAVEN_CACHE`` there is :data:`IMAGE_MAVEN`)."""
    from spanflow.maven import classpath
    from spanflow.spark.jvm.jars import HADOOP_AWS, JNATS, KAFKA_CONNECTOR

    (into / "jars").mkdir(parents=True, exist_ok=True)
    for artifacts in (JNATS, KAFKA_CONNECTOR, HADOOP_AWS):
        inside = []
        for jar in classpath(artifacts):
            shutil.copy2(jar, into / "jars" / jar.name)
            inside.append(f"{IMAGE_MAVEN}/jars/{jar.name}")
        (into / f"{artifacts.key}.classpath").write_text("\n".join(inside) + "\n")


def _host_ca() -> list[str]:
    """Build options that let pip in the build trust what this machine trusts (a
    proxy's CA, ``PIP_CERT``): the bundle mounted for the build's steps, not copied."""
    bundle = os.environ.get("PIP_CERT") or os.environ.get("REQUESTS_CA_BUNDLE")
    if not bundle or not Path(bundle).is_file():
        return []
    inside = "/run/host-ca.crt"
    return ["--volume", f"{Path(bundle).resolve()}:{inside}:ro", "--build-arg", f"HOST_CA={inside}"]


def _pip_cache() -> list[str]:
    """This machine's pip cache for the build's pip (what ``./dev`` downloaded is not
    downloaded again); mounted, so nothing of it stays in the image."""
    cache = Path(os.environ.get("PIP_CACHE_DIR") or Path.home() / ".cache" / "pip")
    if not cache.is_dir():
        return []
    return ["--volume", f"{cache}:/root/.cache/pip", "--build-arg", "PIP_CACHE_MOUNTED=1"]


def build(say: Callable[[str], None] = print, *, data_dir: Path | None = None) -> str:
    """Build the image (its base first if missing); its name."""
    reason = why_not()
    if reason is not None:
        raise PodmanError(reason)
    cache = (data_dir or default_data_dir()) / "images"
    podman = Podman(cache)
    started = time.monotonic()
    ensure_base(podman, cache, say)
    name = image_name()
    with tempfile.TemporaryDirectory(prefix="spanflow-image-") as tmp:
        context = Path(tmp)
        build_context(context, say)
        with step(f"podman build {name}", say):
            podman(
                "build", "--format", "docker", "--network", "host",
                "--build-arg", f"BASE={BASE}", *_host_ca(), *_pip_cache(),
                "-f", str(CONTAINERFILE), "-t", name, "-t", f"{IMAGE}:latest", str(context),
                timeout=3600,
            )  # fmt: skip
    say(f"image {name} built in {time.monotonic() - started:.0f} s")
    return name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, help="where the base image is cached")
    args = parser.parse_args()
    try:
        build(data_dir=args.data_dir)
    except PodmanError as exc:
        sys.exit(f"spanflow image: {exc}")


if __name__ == "__main__":
    main()
