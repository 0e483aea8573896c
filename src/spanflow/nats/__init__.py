"""NATS: the embedded server and JetStream helpers."""

from spanflow.nats.server import EmbeddedNats, default_data_dir, nats_server_binary
from spanflow.nats.streams import SyncNats, connect, ensure_stream

__all__ = [
    "EmbeddedNats",
    "SyncNats",
    "connect",
    "default_data_dir",
    "ensure_stream",
    "nats_server_binary",
]
