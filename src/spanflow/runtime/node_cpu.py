"""CPU a node uses — its agent and the processes it started (Spark's JVM, Python
workers) — as a share of the cores it offers.

Not the machine's CPU: several nodes may share a machine (tests, a big edge box split
in two), and a node is overloaded when *it* uses what it offers, whatever its
neighbours do.
"""

from __future__ import annotations

import psutil


class NodeCpu:
    def __init__(self, cores: int, process: psutil.Process | None = None) -> None:
        self.cores = max(1, cores)
        self.root = process or psutil.Process()
        self._known: dict[int, psutil.Process] = {}

    def percent(self) -> float:
        """Percent of the offered cores used since the last call (0-100, may exceed 100
        briefly when the node uses more than it offers)."""
        total = 0.0
        try:
            tree = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return 0.0
        alive = set()
        for proc in tree:
            known = self._known.setdefault(proc.pid, proc)
            alive.add(proc.pid)
            try:
                total += known.cpu_percent(interval=None)
            except psutil.Error:
                continue
        self._known = {pid: p for pid, p in self._known.items() if pid in alive}
        return total / self.cores
