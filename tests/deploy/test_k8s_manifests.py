"""deploy/k8s/ as a cluster would take it: every manifest valid against the Kubernetes
API's own schema (kubernetes-validate's copy, offline, unknown fields refused), one
namespace, each pod given only its own role's Secret as make-secrets.sh makes them, the
init container's unpacking giving back a bundle the secrets loader reads, and requests
that follow the topology's capabilities."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from kubernetes_validate import utils as kv_utils

from spanflow.api.topology_loader import load_topology
from spanflow.local.kube import SEPARATOR, UNPACK, secret_key
from spanflow.security.secrets import Secrets

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
COMPOSE = K8S.parent / "compose"
VERSION = kv_utils.latest_version()
FOREIGN = {  # a role's Secret → what its credentials must not hold (another role's)
    "spanflow-cloud-1": ("coordinator", "control", "reader", "route", "leaf", "device"),
    "spanflow-edge-a-1": ("coordinator", "control", "reader", "route", "leaf", "device"),
    "spanflow-edge-a-nats": ("coordinator", "control", "reader", "route"),
}


def _manifests() -> list[tuple[str, dict[str, Any]]]:
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    return [(name, d) for name in listed for d in yaml.safe_load_all((K8S / name).read_text())]


def _pods(objects: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """(workload name, its pod spec)."""
    return [
        (d["metadata"]["name"], d["spec"]["template"]["spec"])
        for _, d in objects
        if d["kind"] in ("StatefulSet", "Deployment", "DaemonSet")
    ]


@pytest.fixture(scope="module")
def made_secrets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The Secrets make-secrets.sh writes, by name."""
    work = tmp_path_factory.mktemp("k8s-secrets")
    env = {**os.environ, "SPANFLOW_K8S_SECRETS": str(work / "full"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    out = work / "secrets.yaml"
    subprocess.run(["sh", str(K8S / "make-secrets.sh"), str(out)], env=env, check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    assert out.stat().st_mode & 0o077 == 0, "the Secrets file is readable by others"
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(out.read_text()) if d}


def test_every_manifest_validates_against_the_kubernetes_schema_and_a_typo_does_not() -> None:
    objects = _manifests()
    assert {d["kind"] for _, d in objects} >= {
        "Namespace", "ConfigMap", "Service", "StatefulSet", "Deployment", "PersistentVolumeClaim"
    }  # fmt: skip
    for name, d in objects:
        kubernetes_validate.validate(d, VERSION, strict=True)  # raises, naming the field
        assert d["kind"] == "Namespace" or d["metadata"]["namespace"] == "spanflow", name
    statefulset = next(d for _, d in objects if d["kind"] == "StatefulSet")
    typo = json.loads(json.dumps(statefulset))
    typo["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, VERSION, strict=True)


def test_the_kustomization_names_every_manifest_here() -> None:
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


def test_each_pod_mounts_only_its_own_roles_secret_and_every_one_is_made(
    made_secrets: dict[str, dict[str, Any]],
) -> None:
    for secret in made_secrets.values():
        kubernetes_validate.validate(secret, VERSION, strict=True)
    used = {}
    for workload, pod in _pods(_manifests()):
        names = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        assert len(names) == 1, (workload, names)
        used[workload] = names.pop()
        assert used[workload] in made_secrets, (workload, used[workload])
        assert pod["securityContext"]["runAsNonRoot"] is True
    assert used["cloud-1"] == "spanflow-cloud-1" and used["edge-a-1"] == "spanflow-edge-a-1"
    assert used["hub-nats"] == used["coordinator"] == "spanflow-hub"
    names = _dns_names(made_secrets["spanflow-hub"]["stringData"]["server.crt"])
    dialled = {f"hub-nats-{i}.hub-nats" for i in range(3)} | {
        f"coordinator-{i}.coordinator" for i in range(3)
    }
    assert dialled | {"localhost"} <= names, names  # what the pods dial, and the probes
    for name, foreign in FOREIGN.items():
        data = made_secrets[name]["stringData"]
        held = json.loads(data["credentials.json"])["nats"]
        assert not set(foreign) & set(held), (name, sorted(held))
        assert "ca.key" not in data and "control.key" not in data, name


def _dns_names(pem: str) -> set[str]:
    cert = x509.load_pem_x509_certificate(pem.encode())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(san.get_values_for_type(x509.DNSName))


def test_the_init_container_gives_back_a_bundle_the_secrets_loader_reads(
    made_secrets: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    bundle, secrets = tmp_path / "bundle", tmp_path / "secrets"
    bundle.mkdir()
    for key, text in made_secrets["spanflow-cloud-1"]["stringData"].items():
        (bundle / key).write_text(text)
    script = UNPACK.replace("/bundle", str(bundle)).replace("/secrets", str(secrets))
    subprocess.run(["sh", "-c", script], check=True, timeout=30)
    loaded = Secrets(secrets)
    assert loaded.client_cert("agent").read_text().startswith("-----BEGIN CERTIFICATE")
    assert loaded.identity("agent") is not None
    assert all(p.stat().st_mode & 0o077 == 0 for p in secrets.rglob("*"))
    for _, pod in _pods(_manifests()):
        assert pod["initContainers"][0]["command"] == ["sh", "-c", UNPACK]
    with pytest.raises(Exception, match="cannot be a Kubernetes Secret key"):
        secret_key(f"clients/a{SEPARATOR}b.crt")


def test_the_topology_is_the_compose_one_and_requests_follow_its_capabilities(
    tmp_path: Path,
) -> None:
    objects = _manifests()
    config = next(d for _, d in objects if d["kind"] == "ConfigMap")
    assert config["data"]["topology.yaml"] == (COMPOSE / "topology.yaml").read_text()
    assert config["data"]["pipeline.yaml"] == (COMPOSE / "pipeline.yaml").read_text()
    (tmp_path / "topology.yaml").write_text(config["data"]["topology.yaml"])
    nodes = {n.name: n.capabilities for n in load_topology(tmp_path / "topology.yaml").nodes}
    agents = {w: pod for w, pod in _pods(objects) if w in nodes}
    assert set(agents) == set(nodes)
    for name, pod in agents.items():
        requests = pod["containers"][0]["resources"]["requests"]
        assert float(requests["cpu"]) == nodes[name].cores, name
        assert requests["memory"] == f"{nodes[name].memory_mb // 1024}Gi", name
