"""Why the control plane refuses a request: one class per kind of answer, one stable
code per reason.

Rooms raise these; they know nothing of HTTP. The REST server maps the class to a
status (``spanflow.server.errors``), and answers ``{"code": ..., "detail": ...}`` so
clients can branch on the code while people read the detail.
"""

from __future__ import annotations

from spanflow.errors import SpanflowError


class ControlError(SpanflowError):
    """A control-plane request that cannot be met; ``code`` names the reason."""

    code = "control_error"

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class NotFound(ControlError):
    """No such node, pipeline or savepoint (codes ``no_node``, ``no_pipeline``)."""


class Conflict(ControlError):
    """The request does not fit the current state (``pipeline_active``,
    ``bad_transition``, ``not_running``, ``wrong_site``, ``not_stopped``)."""


class Invalid(ControlError):
    """The request itself is wrong (``unknown_site``, ``invalid_node``, ``unplaceable``,
    ``unknown_model``, ``no_savepoint``, ``invalid_request``)."""


class Unavailable(ControlError):
    """The control plane cannot answer now (``not_connected``, ``not_leader``,
    ``stale_leader``); try again or another coordinator."""


class Unauthorized(ControlError):
    """A missing or wrong bearer token (``unauthorized``)."""


class NotLeader(Unavailable):
    """This replica is a standby; ``leader_url`` is where the leader answers (if known)."""

    def __init__(self, leader: str | None, leader_url: str | None) -> None:
        where = f"; the leader is {leader} at {leader_url}" if leader and leader_url else ""
        super().__init__("not_leader", f"this coordinator is a standby{where}")
        self.leader_url = leader_url
