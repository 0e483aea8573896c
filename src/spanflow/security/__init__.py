"""Certificates, credentials and keys for spanflow's doors (docs/security.md).

Sits just above ``spec``: the NATS helpers, the agents, the coordinators and the
servers all read their secrets through here, and nothing here does network I/O.
"""
