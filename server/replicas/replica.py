"""One engine replica: the single-process server's stack (engine manager,
CompletionService, controller), run by Ray Serve as a deployment replica,
with no listener of its own.

The front end (server/replicas/ingress.py) calls it through a
DeploymentHandle. What crosses Ray is plain data: the request and the
responses as serialized protobuf, the caller as ``admission.Client``, a
refusal as ``(ERROR, code, detail, metadata, field, at)`` (``refusal``), so
that the front end can tell a refusal from a replica that died, and each of
its front ends names the field its own way. A stream starts with
``(REPLICA, replica_id)``: the front end remembers which replica served each
request, to send the request's outcome reports there.
"""

from __future__ import annotations

import contextlib
from collections import Counter
import dataclasses
import logging
import os
import socket
import statistics
import time
from typing import AsyncIterator, Mapping

from quickdraft.server import engine_manager as em
from quickdraft.server.admission import Client
from quickdraft.server.config import QuickdraftConfig
from quickdraft.server.errors import RequestError
from quickdraft.server.speculative import SpecConfig
from quickdraft.v1 import completion_pb2 as pb

log = logging.getLogger("quickdraft.replica")

MESSAGE = "message"
ERROR = "error"
REPLICA = "replica"
# A pin's answer from a replica whose engine does not serve (starting,
# restarting): not a refusal; the front end gives it the pin once it serves.
NOT_SERVING = "NOT_SERVING"

# The "predicted" TTFT the router reads is measured first: the median inline TTFT over this window.
MEASURED_TTFT_WINDOW_S = 60.0
MIN_MEASURED_TTFTS = 3  # fewer: the controller's prediction, if it has one


def refusal(e: RequestError) -> tuple:
    """A RequestError as plain data, every part of it: the front end raises it again (``ingress.refusal_error``)."""
    return (ERROR, e.code, e.detail, dict(e.metadata), e.field, e.at)


def replica_config(cfg: QuickdraftConfig) -> QuickdraftConfig:
    """The configuration a replica runs: the server's, without listeners of its own."""
    out = dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, port=0),
                              telemetry=dataclasses.replace(cfg.telemetry, metrics_port=0),
                              http=dataclasses.replace(cfg.http, enabled=False),
                              replicas=dataclasses.replace(cfg.replicas, count=0))
    return out


class QuickdraftReplica:
    """A Ray Serve deployment class (made one by ``deployment()`` in ingress.py)."""

    async def __init__(self, cfg: QuickdraftConfig, engine_factory=None):
        """``engine_factory``: a fake engine's, for tests; Ray passes ``cfg`` only."""
        logging.basicConfig(level=cfg.server.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        from quickdraft.server.app import QuickdraftServer  # here: Ray imports this module in processes that need no engine

        self.node = socket.gethostname()
        try:
            from ray import serve

            self.replica_id = serve.get_replica_context().replica_id.unique_id
        except Exception:  # noqa: BLE001 - outside Ray (tests): no id
            self.replica_id = ""
        self.server = QuickdraftServer(replica_config(cfg), engine_factory=engine_factory)
        # How this replica's requests ended (stop, length, cancelled, error): shown in its status.
        self.finishes: Counter[str] = Counter()
        self.server.service.observers.callbacks.append(lambda record, spec: self.finishes.update([record.finish]))
        await self.server.start_headless(cfg.replicas.start_timeout_s)

    async def complete(self, payload: bytes, client: Client, headers: Mapping[str, str] | None = None,
                       session: str = "") -> AsyncIterator[tuple]:
        """Stream one completion. ``session`` is read by the router only.
        Ray cancels this generator when the front end cancels the call:
        CompletionService then aborts the engine request."""
        request = pb.CompleteRequest.FromString(payload)
        yield (REPLICA, self.replica_id)
        try:
            async with contextlib.aclosing(self.server.service.complete(request, client, headers)) as stream:
                async for msg in stream:
                    yield (MESSAGE, msg.SerializeToString())
        except RequestError as e:
            yield refusal(e)

    async def controller_state(self, session: str = "") -> bytes:
        """A ``ReplicaControllerState``: this replica's id and its controller's state."""
        server = self.server
        if server.controller is None:
            state = pb.ControllerState(enabled=False, active=server.service.server_info().speculative)
        else:
            state = server.controller.state_proto()
        # Shown with no controller too: through the router, this is where an operator sees which replicas took a pin.
        state.pinned = self._pinned()
        return pb.ReplicaControllerState(replica_id=self.replica_id, state=state).SerializeToString()

    def _pinned(self) -> str:
        pinned = self.server.pin.pinned
        return pinned.label() if pinned is not None else ""

    async def pin(self, config: str, allow_rebuild: bool = False) -> dict:
        """Apply an operator's pin here as the single-process server does
        (``SpeculationPin.set``; empty ``config`` releases). A pin this replica
        holds already is left alone ("unchanged", or "released" when none is
        asked for and none holds), so that the front end may send it to every
        replica when only one lacks it. Returns ``replica_id`` with either
        ``applied``, ``switch_ms``, or ``code`` (NOT_SERVING, or the
        refusal's gRPC code) and ``message``."""
        out: dict = {"replica_id": self.replica_id}
        try:
            want = SpecConfig.parse(config).label() if config.strip() else ""
        except ValueError as e:
            return {**out, "code": "INVALID_ARGUMENT", "message": str(e)}
        if want == self._pinned():
            return {**out, "applied": "unchanged" if want else "released", "switch_ms": 0.0}
        if want and not self.server.engines.serving:
            return {**out, "code": NOT_SERVING, "message": f"engine {self.server.engines.state}"}
        try:
            applied, ms = await self.server.pin.set(config, allow_rebuild)
        except RequestError as e:
            return {**out, "code": e.code, "message": e.message}
        return {**out, "applied": applied, "switch_ms": ms}

    async def report_outcomes(self, payload: bytes, client: Client, headers: Mapping[str, str] | None = None,
                              replica: str = "") -> tuple:
        """Outcomes of requests this replica served, into its own book.
        ``replica`` is read by the router only (it sends the call there).
        Returns ``(MESSAGE, ReportOutcomesResponse bytes)`` or a refusal."""
        request = pb.ReportOutcomesRequest.FromString(payload)
        try:
            reply = self.server.outcomes.report(request, client, self.server.service.telemetry.trace_context(headers or {}))
        except RequestError as e:
            return refusal(e)
        return (MESSAGE, reply.SerializeToString())

    async def outcome_stats(self) -> bytes:
        return self.server.outcomes.stats().SerializeToString()

    async def server_info(self, session: str = "") -> bytes:
        return self.server.service.server_info().SerializeToString()

    def routing_stats(self) -> dict:
        """This replica's load and state, as the router and GetServerInfo see them."""
        service = self.server.service
        serving, state = service.health()
        info = service.server_info()
        ttft, source = self._predicted_ttft_ms(info.speculative.label)
        return {
            "replica_id": self.replica_id,
            "serving": serving,
            "state": state,
            "open_streams": service.admission.open,
            "max_streams": service.admission.max_streams,
            "predicted_ttft_ms": ttft,
            "ttft_source": source,
            "speculative_config": info.speculative.label,
            "pinned": self._pinned(),
            "prefix_cache_queried_tokens": info.prefix_cache_queried_tokens,
            "prefix_cache_hit_tokens": info.prefix_cache_hit_tokens,
            "node": self.node,
            "pid": os.getpid(),
            "finishes": dict(self.finishes),
            # Wall clock, for the router's staleness check (routing.STALE_PERIODS).
            "reported_at": time.time(),
        }

    def record_routing_stats(self) -> dict:
        # Ray Serve calls this every request_routing_stats_period_s; the router reads it.
        return self.routing_stats()

    async def status(self, session: str = "") -> dict:
        return self.routing_stats()

    def _predicted_ttft_ms(self, active_label: str) -> tuple[float, str]:
        """What the router compares with the spill threshold: the median inline
        TTFT this replica measured over the last minute, else (too few
        measured) its controller's prediction for the running config."""
        now = time.perf_counter()
        recent = [ttft for cls, ttft, at in list(self.server.service.meter.first_tokens)
                  if cls == "inline" and now - at <= MEASURED_TTFT_WINDOW_S]
        if len(recent) >= MIN_MEASURED_TTFTS:
            return statistics.median(recent) * 1e3, "measured"
        controller = self.server.controller
        if controller is not None:
            for c in controller.state_proto().candidates:
                if c.config == active_label and c.predicted_ttft_ms > 0:
                    return c.predicted_ttft_ms, "controller"
        if recent:
            return statistics.median(recent) * 1e3, "measured"
        return 0.0, ""

    async def check_health(self) -> None:
        # Ray Serve calls this periodically; raising makes it replace the replica.
        if self.server.engines.state == em.FAILED:
            raise RuntimeError("the engine failed and could not be restarted")

    async def __del__(self) -> None:
        # Ray Serve's graceful shutdown: drain this replica's streams, stop its engine.
        await self.server.shutdown()
