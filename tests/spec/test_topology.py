"""Topology files: valid ones load; every mistake is reported with its line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from spanflow.api.topology_loader import load_topology, load_topology_text
from spanflow.errors import TopologyFileError
from spanflow.spec.topology import Link, NodeSpec, Topology

ROOT = Path(__file__).resolve().parents[2]

GOOD = """\
name: plant
sites:
  - {name: edge-a, kind: edge}
  - {name: cloud, kind: cloud, partition: eu}
nodes:
  - name: a1
    site: edge-a
    capabilities: {cores: 4, memory_mb: 8g, accelerators: [tpu], tags: [camera], slots: 3}
    streams:
      - {name: CAMS, subjects: ["cams.>"], format: json, schema: {id: string}, key: id}
    local: true
  - {name: c1, site: cloud}
links:
  - {between: [edge-a, cloud], latency: 25ms, bandwidth_mbps: 40}
"""


def test_good_topology_loads_with_units_and_defaults() -> None:
    topo = load_topology_text(GOOD, "plant.yaml")
    a1 = topo.node("a1")
    assert a1 is not None
    assert a1.capabilities.memory_mb == 8192
    assert a1.capabilities.fragment_slots == 3
    assert topo.node("c1").capabilities.fragment_slots == 2  # type: ignore[union-attr]
    assert [n.name for n in topo.hosts_of("CAMS")] == ["a1"]
    assert topo.latency("cloud", "edge-a") == pytest.approx(0.025)
    assert topo.latency("edge-a", "edge-a") == 0.0
    assert topo.site("cloud").partition_name == "eu"  # type: ignore[union-attr]


def _problems(text: str) -> str:
    with pytest.raises(TopologyFileError) as info:
        load_topology_text(text, "t.yaml")
    return str(info.value)


def test_unknown_site_and_link_ends_name_their_lines() -> None:
    text = GOOD.replace("site: cloud}", "site: clod}").replace("[edge-a, cloud]", "[edge-a, mars]")
    message = _problems(text)
    assert "t.yaml:12: nodes[1].site: node 'c1' is in unknown site 'clod'" in message
    assert "t.yaml:14: links[0].between: link edge-a-mars names unknown site 'mars'" in message


def test_field_errors_name_line_and_field() -> None:
    message = _problems(
        "sites:\n  - {name: a, kind: moon}\nnodes:\n  - name: n1\n    site: a\n"
        "    capabilities: {cores: 0, memory_mb: lots}\n"
    )
    assert "t.yaml:2: sites[0].kind:" in message
    assert "t.yaml:6: nodes[0].capabilities.cores:" in message
    assert "memory 'lots' is not a size" in message


def test_duplicates_and_self_links_are_refused() -> None:
    message = _problems(
        "sites: [{name: a}, {name: a}]\nnodes: [{name: n, site: a}, {name: n, site: a}]\n"
    )
    assert "t.yaml:1: sites[1].name: site 'a' is declared twice" in message
    assert "t.yaml:2: nodes[1].name: node 'n' is declared twice" in message
    assert "t.yaml:1: links[0]: a link joins two different sites" in _problems(
        "links: [{between: [a, a]}]\n"
    )


def test_yaml_tags_and_non_mappings_are_refused() -> None:
    assert "not allowed" in _problems("sites: !!python/object:os.system {}\n")
    assert "must be a mapping" in _problems("- a\n- b\n")


def test_live_changes_revalidate() -> None:
    topo = load_topology_text(GOOD)
    joined = topo.with_node(NodeSpec(name="a2", site="edge-a"))
    assert {n.name for n in joined.nodes} == {"a1", "a2", "c1"}
    assert joined.without_node("a1").node("a1") is None
    relinked = topo.with_link(Link(between=("cloud", "edge-a"), latency=0.1))
    assert relinked.latency("edge-a", "cloud") == pytest.approx(0.1) and len(relinked.links) == 1
    with pytest.raises(ValueError, match="unknown site 'nowhere'"):
        topo.with_node(NodeSpec(name="x", site="nowhere"))


def test_shipped_example_topology_is_valid() -> None:
    topo = load_topology(ROOT / "examples" / "cluster" / "topology.yaml")
    assert isinstance(topo, Topology)
    assert sorted(n.name for n in topo.nodes if n.local) == ["cloud-1", "edge-a", "edge-b"]
