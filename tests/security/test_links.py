"""Leaf links and cluster routes of locked servers: authenticated and over TLS. A site
server with the right secrets joins the hub; one with another deployment's secrets is
refused and its log says why; a locked three-server cluster replicates (its routes
authenticate)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from nats.js.api import StreamConfig

from spanflow.nats.server import EmbeddedNats, NatsCluster
from spanflow.nats.streams import connect
from spanflow.security.secrets import Secrets


def _wait_for(condition: object, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_site_with_our_secrets_joins_the_hub_and_a_stranger_is_refused(tmp_path: Path) -> None:
    ours, theirs = Secrets(tmp_path / "ours"), Secrets(tmp_path / "theirs")
    ours.init()
    theirs.init()
    with EmbeddedNats(tmp_path / "hub", name="hub", leaf_listen=True, secrets=ours) as hub:
        site = EmbeddedNats(tmp_path / "site", name="site", leaf_remote=hub.leaf_url, secrets=ours)
        stranger = EmbeddedNats(
            tmp_path / "stranger", name="stranger", leaf_remote=hub.leaf_url, secrets=theirs
        )
        with site, stranger:

            async def across() -> bytes:
                at_hub = await connect(hub.url, identity=ours.identity("coordinator"))
                at_site = await connect(site.url, identity=ours.identity("agent"))
                sub = await at_hub.subscribe("site.readings")
                await at_hub.flush()
                deadline = asyncio.get_running_loop().time() + 20
                while True:  # until the leaf link is up and the interest has crossed it
                    await at_site.publish("site.readings", b"42")
                    try:
                        msg = await sub.next_msg(timeout=0.5)
                        break
                    except TimeoutError:
                        assert asyncio.get_running_loop().time() < deadline, "no leaf link"
                await at_hub.close()
                await at_site.close()
                return bytes(msg.data)

            assert asyncio.run(across()) == b"42"
            log = stranger.data_dir / "nats.log"
            _wait_for(
                lambda: "certificate" in log.read_text(errors="replace").lower(),
                "the refused site's log never said why",
            )


def test_a_locked_cluster_replicates_over_authenticated_routes(tmp_path: Path) -> None:
    secrets = Secrets(tmp_path / "secrets")
    secrets.init()
    with NatsCluster(tmp_path / "cluster", 3, secrets=secrets) as cluster:

        async def replicated() -> int:
            nc = await connect(cluster.url, identity=secrets.identity("coordinator"))
            js = nc.jetstream()
            deadline = asyncio.get_running_loop().time() + 30
            while True:  # the meta leader is elected once the routes are up
                try:
                    await js.add_stream(StreamConfig(name="R3", subjects=["r3.>"], num_replicas=3))
                    break
                except Exception:
                    assert asyncio.get_running_loop().time() < deadline, "no JetStream quorum"
                    await asyncio.sleep(0.2)
            await js.publish("r3.x", b"1")
            info = await js.stream_info("R3")
            await nc.close()
            return len(info.cluster.replicas or []) + 1 if info.cluster else 0

        assert asyncio.run(replicated()) == 3
        assert cluster.url.count("tls://") == 3
