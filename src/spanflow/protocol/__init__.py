"""What crosses a process boundary: the coordinator's HTTP client (with fail-over)."""
