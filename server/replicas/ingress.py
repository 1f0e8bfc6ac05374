"""The front end of a replicated server (``quickdraft serve --replicas N``):
this process keeps the gRPC listener of the single-process server (auth,
TLS, health, reflection: server/grpc_server.py, unchanged) and forwards each
completion to one of N engine replicas, a Ray Serve deployment
(server/replicas/replica.py), through a DeploymentHandle whose request
router (server/replicas/router.py) routes by session.

``RoutedService`` stands where ``CompletionService`` stands for the gRPC
servicer. Cancellation: a cancelled gRPC call cancels the handle call
explicitly (Ray does not cancel the replica when the awaiting task is
cancelled), which aborts the engine request on the replica.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from typing import AsyncIterator, Callable, Mapping

from quickdraft.server.admission import Admission, Client
from quickdraft.server.config import ConfigError, QuickdraftConfig
from quickdraft.server.config.validation import check_remote_exposure
from quickdraft.server.errors import RequestError
from quickdraft.server.frontend import Auth
from quickdraft.server.grpc_server import GrpcServer
from quickdraft.server.replicas.replica import ERROR, MESSAGE, QuickdraftReplica
from quickdraft.server.replicas.routing import session_key
from quickdraft.server.telemetry import Telemetry
from quickdraft.v1 import completion_pb2 as pb

log = logging.getLogger("quickdraft.server")

DEPLOYMENT_NAME = "QuickdraftReplica"
# Headers worth carrying to the replica: the W3C trace context (the span's parent).
FORWARDED_HEADERS = ("traceparent", "tracestate")


def check_replicas_config(cfg: QuickdraftConfig) -> None:
    """What --replicas does not support yet, refused before anything starts."""
    cfg.replicas.validate()
    if cfg.replicas.count < 1:
        raise ConfigError("replicas.count must be >= 1 to run replicas (0 runs the single-process server)")
    if cfg.http.enabled:
        raise ConfigError("http.enabled with replicas.count > 0: the HTTP API is not routed to replicas yet; use gRPC, or replicas.count = 0")


def _is_replica_gone(e: BaseException) -> bool:
    from ray.exceptions import ActorUnavailableError, RayActorError

    return isinstance(e, (RayActorError, ActorUnavailableError))


class RoutedService:
    """The gRPC servicer's service when the engines are replicas: the same
    calls as CompletionService, each forwarded to a replica."""

    def __init__(self, cfg: QuickdraftConfig, handle, telemetry: Telemetry):
        self.cfg = cfg
        self.handle = handle
        self.telemetry = telemetry
        # Per-client limits hold across replicas here; each replica enforces its own total.
        self.admission = Admission(cfg.limits.max_concurrent_streams * max(1, cfg.replicas.count), cfg.limits.max_streams_per_client)
        self.statuses: list[dict] = []
        self.info: pb.ServerInfo | None = None
        self.controller: pb.ControllerState | None = None
        self.retried = 0

    def stop_accepting(self) -> None:
        self.admission.accepting = False

    def health(self) -> tuple[bool, str]:
        """Serving while any replica serves (as of the last poll)."""
        if not self.admission.accepting:
            return False, "draining"
        if any(s.get("serving") for s in self.statuses):
            return True, "serving"
        return False, self.statuses[0].get("state", "starting") if self.statuses else "starting"

    def refused(self, code: str, user: str = "anonymous") -> None:
        self.telemetry.reject(code, user=user)

    async def complete(self, req: pb.CompleteRequest, client: Client | str = "anonymous",
                       headers: Mapping[str, str] | None = None) -> AsyncIterator[pb.CompleteResponse]:
        """Forward one completion. Before the first message a replica that is
        gone or answers UNAVAILABLE is left for another (replicas.max_attempts);
        after it, the stream ends with UNAVAILABLE (text is never replayed)."""
        client = client if isinstance(client, Client) else Client(client)
        session = session_key(req.session, client, req.repo_name)
        payload = req.SerializeToString()
        carried = {k: v for k, v in (headers or {}).items() if k in FORWARDED_HEADERS}
        try:
            if self.handle is None:
                raise RequestError("UNAVAILABLE", "the engine replicas are starting; retry shortly")
            with self.admission.admit(client):
                for attempt in range(1, self.cfg.replicas.max_attempts + 1):
                    started = False
                    done = False
                    call = self.handle.options(stream=True).complete.remote(payload, client, carried, session=session)
                    try:
                        async for item in call:
                            if item[0] == ERROR:
                                _, code, message, metadata = item
                                if code == "UNAVAILABLE" and not started and attempt < self.cfg.replicas.max_attempts:
                                    break  # engine restarting or draining there: try another
                                raise RequestError(code, message, metadata)
                            if item[0] == MESSAGE:
                                started = True
                                yield pb.CompleteResponse.FromString(item[1])
                        else:
                            done = True
                            return
                    except RequestError:
                        done = True
                        raise
                    except Exception as e:  # noqa: BLE001
                        if not _is_replica_gone(e):
                            done = True
                            log.exception("replica call failed")
                            raise RequestError("INTERNAL", f"replica call failed: {type(e).__name__}") from e
                        if started or attempt >= self.cfg.replicas.max_attempts:
                            done = True
                            raise RequestError("UNAVAILABLE", "the replica serving this request stopped; retry") from e
                        log.warning("replica gone before request streamed (attempt %d): %s", attempt, type(e).__name__)
                    finally:
                        if not done:
                            # Cancelled caller (or a retry): stop the replica's work now.
                            call.cancel()
                    self.retried += 1
        except RequestError as e:
            self.telemetry.reject(e.code, user=client.user)
            raise

    def server_info(self) -> pb.ServerInfo:
        info = pb.ServerInfo()
        if self.info is not None:
            info.CopyFrom(self.info)
        serving, state = self.health()
        info.state = state
        if self.statuses:
            info.prefix_cache_queried_tokens = sum(int(s.get("prefix_cache_queried_tokens", 0)) for s in self.statuses)
            info.prefix_cache_hit_tokens = sum(int(s.get("prefix_cache_hit_tokens", 0)) for s in self.statuses)
        del info.replicas[:]
        info.replicas.extend(replica_status_message(s) for s in self.statuses)
        return info

    def controller_state(self) -> pb.ControllerState | None:
        return self.controller

    async def refresh(self) -> None:
        """Every replica's status, one replica's server info and controller state."""
        statuses = await self.handle.broadcast("status").results_async(return_exceptions=True)
        self.statuses = sorted((s for s in statuses if isinstance(s, dict)), key=lambda s: s.get("replica_id", ""))
        if any(s.get("serving") for s in self.statuses):
            self.info = pb.ServerInfo.FromString(await self.handle.server_info.remote())
            self.controller = pb.ControllerState.FromString(await self.handle.controller_state.remote())


class ReplicaMetrics:
    """Each replica's state as the front end last polled it, on the front end's
    metrics endpoint (the replicas run with no endpoint of their own): open
    streams, predicted inline TTFT, serving or not, prefix-cache tokens, one
    series per replica id (their number is the replica count, plus those Ray
    replaced since the front end started)."""

    def __init__(self, telemetry: Telemetry, statuses: Callable[[], list[dict]]):
        from opentelemetry.metrics import Observation

        self._statuses = statuses
        meter = telemetry.meter_provider.get_meter("quickdraft.replicas")

        def gauge(field: str, scale: float = 1.0):
            def observe(_options):
                return [Observation(float(s.get(field, 0) or 0) * scale, replica_attributes(s)) for s in self._statuses()]
            return observe

        def serving(_options):
            return [Observation(1 if s.get("serving") else 0, replica_attributes(s)) for s in self._statuses()]

        meter.create_observable_gauge("quickdraft.replica.open_streams", [gauge("open_streams")], unit="{stream}",
                                      description="Completion streams open on each replica")
        meter.create_observable_gauge("quickdraft.replica.predicted_ttft", [gauge("predicted_ttft_ms", 1e-3)], unit="s",
                                      description="Each replica's inline TTFT figure for routing (its last minute's median, else its controller's prediction; 0: unknown)")
        meter.create_observable_gauge("quickdraft.replica.serving", [serving], unit="1",
                                      description="1 while the replica's engine serves, 0 while it starts, switches, restarts or drains")
        meter.create_observable_counter("quickdraft.replica.prefix_cache.queried_tokens", [gauge("prefix_cache_queried_tokens")],
                                        unit="{token}", description="Prompt tokens each replica's engine looked up in its prefix cache")
        meter.create_observable_counter("quickdraft.replica.prefix_cache.hit_tokens", [gauge("prefix_cache_hit_tokens")],
                                        unit="{token}", description="Prompt tokens each replica's engine found in its prefix cache")


def replica_attributes(s: Mapping[str, object]) -> dict[str, str]:
    return {"quickdraft.replica": str(s.get("replica_id", "")), "quickdraft.speculative.config": str(s.get("speculative_config", "")),
            "quickdraft.replica.node": str(s.get("node", ""))}


class RefusedPin:
    """PinSpeculation in replica mode: refused, saying why (server/grpc_server.py
    turns the RequestError into the call's status)."""

    async def set(self, config: str, allow_rebuild: bool = False) -> tuple[str, float]:
        raise RequestError("UNIMPLEMENTED", "PinSpeculation does not reach engine replicas yet (quickdraft serve --replicas): "
                           "each replica's controller chooses for its own load. To run one setting on every replica, start "
                           "the server with it (--set speculation.*=..., without --controller); docs/scaling.md")


def front_end(cfg: QuickdraftConfig, service: RoutedService, auth: Auth) -> GrpcServer:
    """The single-process server's gRPC listener around ``service``. Outcome
    reports are not routed (no outcome book: UNIMPLEMENTED, which the LSP
    bridge takes as "stop reporting"); a pin is refused saying why."""
    return GrpcServer(cfg, service, auth, controller_state=service.controller_state,  # type: ignore[arg-type]
                      pin=RefusedPin())  # type: ignore[arg-type]


def replica_status_message(s: Mapping[str, object]) -> pb.ReplicaStatus:
    return pb.ReplicaStatus(replica_id=str(s.get("replica_id", "")), state=str(s.get("state", "")),
                            speculative_config=str(s.get("speculative_config", "")),
                            open_streams=int(s.get("open_streams", 0)), max_streams=int(s.get("max_streams", 0)),
                            predicted_ttft_ms=float(s.get("predicted_ttft_ms", 0.0)), ttft_source=str(s.get("ttft_source", "")),
                            prefix_cache_queried_tokens=int(s.get("prefix_cache_queried_tokens", 0)),
                            prefix_cache_hit_tokens=int(s.get("prefix_cache_hit_tokens", 0)), node=str(s.get("node", "")))


def replica_gpus(cfg: QuickdraftConfig) -> float:
    """GPUs per replica: the setting, else the engine's tensor-parallel size
    on CUDA (Ray hides every GPU from an actor that reserved none)."""
    if cfg.replicas.gpus_per_replica:
        return cfg.replicas.gpus_per_replica
    return float(cfg.engine.tensor_parallel_size) if cfg.device() == "cuda" else 0.0


def deployment(cfg: QuickdraftConfig):
    """The replica deployment, bound to its configuration (a Ray Serve Application)."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from quickdraft.server.replicas.router import SessionRouter

    rc = cfg.replicas
    spill = rc.spill_ttft_ms or cfg.controller.slo.ttft_s.get("inline", 0.0) * 1e3
    return serve.deployment(QuickdraftReplica, name=DEPLOYMENT_NAME).options(
        num_replicas=rc.count,
        # Ray's queue limit per replica = the replica's own stream limit, so a
        # full replica is skipped by the router rather than refusing.
        max_ongoing_requests=cfg.limits.max_concurrent_streams,
        ray_actor_options={"num_cpus": rc.cpus_per_replica, "num_gpus": replica_gpus(cfg)},
        health_check_period_s=5.0,
        graceful_shutdown_timeout_s=cfg.server.grace_period_s,
        request_router_config=RequestRouterConfig(request_router_class=SessionRouter,
                                                  request_router_kwargs={"spill_ttft_ms": spill, "routing": rc.routing,
                                                                         "stats_period_s": rc.stats_period_s},
                                                  request_routing_stats_period_s=rc.stats_period_s),
    ).bind(cfg)


class ReplicaServer:
    """``quickdraft serve --replicas N``: Ray, the replica deployment, and the gRPC front end."""

    POLL_S = 1.0

    def __init__(self, cfg: QuickdraftConfig):
        check_replicas_config(cfg)
        self.cfg = cfg
        self.telemetry = Telemetry(cfg.preset.name, cfg.telemetry.metrics_port, cfg.telemetry.metrics_host, cfg.telemetry.otlp_endpoint)
        self.auth = Auth.from_config(cfg)
        self.service: RoutedService | None = None
        self.metrics = ReplicaMetrics(self.telemetry, lambda: self.service.statuses if self.service else [])
        self.grpc: GrpcServer | None = None
        self.port = 0
        self._poller: asyncio.Task | None = None
        self._stop = asyncio.Event()
        self._owns_ray = False

    async def start(self) -> int:
        """Bind the gRPC port (NOT_SERVING), start Ray and the replicas; serving once one replica serves."""
        check_remote_exposure(self.cfg)
        import ray
        from ray import serve

        rc = self.cfg.replicas
        if not ray.is_initialized():
            kwargs = {"address": rc.ray_address} if rc.ray_address else {}
            await asyncio.to_thread(ray.init, include_dashboard=False, log_to_driver=False, **kwargs)
            self._owns_ray = True
        # No Ray HTTP proxy: this process is the only ingress.
        await asyncio.to_thread(serve.start, proxy_location="Disabled")
        # Ray's core worker installs a handler that aborts on SIGTERM: ours again, after it.
        self._install_signals()
        self.service = RoutedService(self.cfg, None, self.telemetry)  # the handle comes once the replicas run
        self.grpc = front_end(self.cfg, self.service, self.auth)
        self.port = await self.grpc.start()
        t0 = time.perf_counter()
        self.service.handle = await asyncio.wait_for(
            asyncio.to_thread(serve.run, deployment(self.cfg), name=rc.app_name, route_prefix=None), rc.start_timeout_s)
        log.info("%d replicas up in %.1f s", rc.count, time.perf_counter() - t0)
        await self.service.refresh()
        self.grpc.set_serving(self.service.health()[0])
        self._poller = asyncio.create_task(self._poll(), name="replica-poll")
        return self.port

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.POLL_S)
            try:
                await self.service.refresh()
            except Exception:  # noqa: BLE001 - a failed poll keeps the last view
                log.exception("replica status poll failed")
            self.grpc.set_serving(self.service.health()[0])

    async def shutdown(self, grace_s: float | None = None) -> None:
        from ray import serve

        grace = self.cfg.server.grace_period_s if grace_s is None else grace_s
        if self._poller:
            self._poller.cancel()
        if self.service:
            self.service.stop_accepting()
        if self.grpc:
            await self.grpc.drain()
            await self.grpc.stop(grace)
        try:
            await asyncio.to_thread(serve.delete, self.cfg.replicas.app_name)
        except Exception:  # noqa: BLE001 - Ray may be gone already
            log.exception("could not delete the replicas' application")
        if self._owns_ray:
            import ray

            # Our own local Ray (no replicas.ray_address) goes with us; a cluster we joined stays.
            await asyncio.to_thread(ray.shutdown)
        self.telemetry.shutdown()

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # embedded in another program's loop (tests): its signals are its own
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)

    async def serve_forever(self) -> int:
        """Run until SIGTERM/SIGINT; exit code 0 after a clean drain."""
        stop = self._stop
        self._install_signals()
        try:
            await self.start()
        except (OSError, ConfigError, asyncio.TimeoutError) as e:
            print(f"quickdraft serve: {e or 'replicas did not start within replicas.start_timeout_s'}", flush=True)
            await self.shutdown(0)
            return 1
        routed = "by session" if self.cfg.replicas.routing == "session" else "round-robin"
        print(f"quickdraft: gRPC on {self.cfg.server.host}:{self.port}, {self.cfg.replicas.count} replicas of "
              f"{self.cfg.preset.name} (Ray Serve, routed {routed})", flush=True)
        await stop.wait()
        await self.shutdown()
        return 0
