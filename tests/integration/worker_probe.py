"""A vLLM worker extension for tests (engine arg ``worker_extension_cls``):
answers ``collective_rpc`` calls from inside the Worker process.

It exists because the Worker's environment cannot be read from outside:
vLLM's setproctitle overwrites the memory /proc/<pid>/environ shows. It
extends quickdraft's own worker extension, which a live engine needs
(an engine takes one ``worker_extension_cls``).
"""

from __future__ import annotations

import os
import sys

from quickdraft.server.vllm_live import LiveDraftingWorker


class WorkerProbe(LiveDraftingWorker):
    def quickdraft_probe_environ(self, name: str) -> str | None:
        return os.environ.get(name)

    def quickdraft_probe_started_by_exec(self) -> bool:
        """True when the process was spawned (a new interpreter, so glibc read
        the environment at its start), not forked from one that already had."""
        return "--multiprocessing-fork" in sys.orig_argv
