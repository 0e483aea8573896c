"""Peer-to-peer load shedding: the policy (pure) and its settings."""
