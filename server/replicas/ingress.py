"""The front end of a replicated server (``quickdraft serve --replicas N``):
this process keeps the listeners of the single-process server, gRPC (auth,
TLS, health, reflection: server/grpc_server.py, unchanged) and, with
``http.enabled``, the OpenAI HTTP API (server/openai/, unchanged), and
forwards each completion to one of N engine replicas, a Ray Serve deployment
(server/replicas/replica.py), through a DeploymentHandle whose request
router (server/replicas/router.py) routes by session.

``RoutedService`` stands where ``CompletionService`` stands for the gRPC
servicer and for ``OpenAIServing``. Cancellation: a cancelled call (gRPC
cancel or deadline, an HTTP client gone) cancels the handle call explicitly
(Ray does not cancel the replica when the awaiting task is cancelled), which
aborts the engine request on the replica.

The calls that concern more than one request's replica: ``PinSpeculation``
goes to every replica (``ReplicaPin``), ``GetControllerState`` and
``GetOutcomeStats`` gather every replica's answer, ``ReportOutcomes`` sends
each outcome to the replica that served its request (``RoutedService.report_outcomes``).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, AsyncIterator, Callable, Mapping, Sequence

import grpc

from quickdraft.server.admission import Admission, Client
from quickdraft.server.config import ConfigError, QuickdraftConfig
from quickdraft.server.config.validation import check_remote_exposure
from quickdraft.server.errors import RequestError
from quickdraft.server.frontend import FINISH_REASON_NAMES, Auth
from quickdraft.server.grpc_server import CompletionServicer, GrpcServer, abort_unparsed
from quickdraft.server.outcomes import Figures, check_report
from quickdraft.server.replicas.replica import ERROR, MESSAGE, NOT_SERVING, REPLICA, QuickdraftReplica
from quickdraft.server.replicas.routing import session_key
from quickdraft.server.speculative import SpecConfig
from quickdraft.server.request_validation import LATENCY_CLASS_NAMES
from quickdraft.server.telemetry import RequestRecord, Telemetry
from quickdraft.v1 import completion_pb2 as pb

if TYPE_CHECKING:
    from quickdraft.server.openai.http_server import HttpServer

log = logging.getLogger("quickdraft.server")

DEPLOYMENT_NAME = "QuickdraftReplica"
# Headers worth carrying to the replica: the W3C trace context (the span's parent).
FORWARDED_HEADERS = ("traceparent", "tracestate")
# Request -> replica entries kept per replica: what a replica's OutcomeBook
# remembers by default; an outcome for an older request is unknown there anyway.
SERVED_BY_PER_REPLICA = 8192
# How a pin was applied, least to most disruptive: a pin's answer names the most disruptive any replica took.
APPLIED_ORDER = ("released", "unchanged", "live", "standby", "rebuild")


def check_replicas_config(cfg: QuickdraftConfig) -> None:
    """Settings --replicas cannot run with, refused before anything starts."""
    cfg.replicas.validate()
    if cfg.replicas.count < 1:
        raise ConfigError("replicas.count must be >= 1 to run replicas (0 runs the single-process server)")


def refusal_error(item: tuple) -> RequestError:
    """A replica's refusal (``replica.refusal``) as the RequestError it raised:
    with its field, which the HTTP API names as the parameter the client sent."""
    _, code, detail, metadata, field, at = item
    return RequestError(code, detail, metadata, field=field, at=at)


def _is_replica_gone(e: BaseException) -> bool:
    from ray.exceptions import ActorUnavailableError, RayActorError

    return isinstance(e, (RayActorError, ActorUnavailableError))


@dataclass
class Relay:
    """What the front end saw of one forwarded completion (``RoutedService._record``)."""

    arrival: float
    replica: str = ""  # the replica of the current attempt, once it answered
    started: bool = False  # a message was relayed
    first: float | None = None  # perf_counter at the first text relayed
    final: pb.CompleteFinal | None = None
    finish: str = ""  # error or cancelled when the stream ended without its final message


class RoutedService:
    """The front ends' service when the engines are replicas: the same calls
    as CompletionService (``serving.Service`` is what HTTP needs), each
    forwarded to a replica."""

    def __init__(self, cfg: QuickdraftConfig, handle, telemetry: Telemetry):
        self.cfg = cfg
        self.handle = handle
        self.telemetry = telemetry
        # Per-client limits hold across replicas here; each replica enforces its own total.
        self.admission = Admission(cfg.limits.max_concurrent_streams * max(1, cfg.replicas.count), cfg.limits.max_streams_per_client)
        self.statuses: list[dict] = []
        self.info: pb.ServerInfo | None = None
        self.retried = 0
        # (user, request id) -> the replica that served it, newest last: where its outcomes go.
        self.served_by: OrderedDict[tuple[str, str], str] = OrderedDict()
        self.max_served = SERVED_BY_PER_REPLICA * max(1, cfg.replicas.count)
        self.pin = ReplicaPin(self)

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
        after it, the stream ends with UNAVAILABLE (text is never replayed).
        The request's metrics are recorded here, from the relayed stream
        (``_record``): the replicas export none."""
        client = client if isinstance(client, Client) else Client(client)
        session = session_key(req.session, client, req.repo_name)
        payload = req.SerializeToString()
        carried = {k: v for k, v in (headers or {}).items() if k in FORWARDED_HEADERS}
        relay = Relay(arrival=time.perf_counter())
        try:
            if self.handle is None:
                raise RequestError("UNAVAILABLE", "the engine replicas are starting; retry shortly")
            with self.admission.admit(client):
                for attempt in range(1, self.cfg.replicas.max_attempts + 1):
                    started = False
                    done = False
                    replica = relay.replica = ""
                    call = self.handle.options(stream=True).complete.remote(payload, client, carried, session=session)
                    try:
                        async for item in call:
                            if item[0] == REPLICA:
                                replica = relay.replica = item[1]
                                if req.request_id:
                                    self._served(client.user, req.request_id, replica)
                            elif item[0] == ERROR:
                                if item[1] == "UNAVAILABLE" and not started and attempt < self.cfg.replicas.max_attempts:
                                    break  # engine restarting or draining there: try another
                                raise refusal_error(item)
                            elif item[0] == MESSAGE:
                                started = relay.started = True
                                msg = pb.CompleteResponse.FromString(item[1])
                                if msg.text and relay.first is None:
                                    relay.first = time.perf_counter()
                                if msg.HasField("final"):
                                    relay.final = msg.final
                                    if replica:
                                        self._served(client.user, msg.final.request_id, replica)  # the id the replica made
                                yield msg
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
            relay.finish = "error"
            self.telemetry.reject(e.code, user=client.user)
            raise
        except (asyncio.CancelledError, GeneratorExit):
            relay.finish = "cancelled"  # the caller went: task cancelled, generator closed
            raise
        finally:
            self._record(req, client, relay)

    def _record(self, req: pb.CompleteRequest, client: Client, relay: Relay) -> None:
        """The request's metrics as the single-process service records them
        (``Telemetry.record``: the same series), from what this front end
        relayed. With a final message, its figures: the replica's TTFT and
        TPOT, tokens, finish reason, speculative config and drafts. Without
        one, a request that reached a replica and was cancelled, or failed
        after its first message, counts ``cancelled`` or ``error`` with the
        TTFT measured here (to its first text), the replica's config as last
        polled, and no token figures (a replica relays none before its final
        message). A refusal before any message counts as a refusal only."""
        final = relay.final
        if final is None and not (relay.replica and (relay.finish == "cancelled" or (relay.finish == "error" and relay.started))):
            return
        common = dict(latency_class=LATENCY_CLASS_NAMES.get(req.latency_class, "inline"), duration_s=time.perf_counter() - relay.arrival,
                      user=client.user, language=req.language_id)
        if final is not None:
            spec = final.speculative
            record = RequestRecord(
                ttft_s=final.ttft_ms / 1000 if final.completion_tokens else None,
                tpot_s=final.tpot_ms / 1000 if final.completion_tokens >= 2 else None,
                prompt_tokens=final.prompt_tokens, completion_tokens=final.completion_tokens,
                finish=FINISH_REASON_NAMES.get(final.finish_reason, "unspecified"), spec_label=spec.config,
                accepted_per_position=list(spec.accepted_per_position), num_drafts=spec.num_drafts,
                request_id=final.request_id, **common)
        else:
            status = next((s for s in self.statuses if s.get("replica_id") == relay.replica), {})
            label = str(status.get("speculative_config", "")) or (self.info.speculative.label if self.info is not None else "")
            record = RequestRecord(
                ttft_s=None if relay.first is None else relay.first - relay.arrival, tpot_s=None,
                prompt_tokens=None, completion_tokens=None, finish=relay.finish, spec_label=label,
                accepted_per_position=[], num_drafts=0, request_id=req.request_id, **common)
        try:
            self.telemetry.record(record)
        except Exception:  # noqa: BLE001 - metrics must never fail a request
            log.exception("could not record a relayed request's metrics")

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

    async def refresh(self) -> None:
        """Every replica's status, and one replica's server info."""
        self.statuses = sorted((s for s in await self.broadcast("status") if isinstance(s, dict)),
                               key=lambda s: s.get("replica_id", ""))
        if any(s.get("serving") for s in self.statuses):
            self.info = pb.ServerInfo.FromString(await self.handle.server_info.remote())

    async def broadcast(self, method: str, *args) -> list:
        """``method`` on every running replica: one answer each, or the exception it raised."""
        if self.handle is None:
            raise RequestError("UNAVAILABLE", "the engine replicas are starting; retry shortly")
        return await self.handle.broadcast(method, *args).results_async(return_exceptions=True)

    def _served(self, user: str, request_id: str, replica: str) -> None:
        key = (user, request_id)
        self.served_by[key] = replica
        self.served_by.move_to_end(key)
        while len(self.served_by) > self.max_served:
            self.served_by.popitem(last=False)

    async def controller_states(self) -> pb.ControllerState:
        """Each replica's controller in ``replicas``; the top-level fields are
        the first replica's, for clients that read one controller."""
        state = pb.ControllerState(enabled=False, active=self.server_info().speculative)
        if self.handle is None:
            return state  # replicas starting: as a single server answers while its engine starts
        answers = sorted((pb.ReplicaControllerState.FromString(a) for a in await self.broadcast("controller_state")
                          if isinstance(a, bytes)), key=lambda a: a.replica_id)
        if answers:
            state.CopyFrom(answers[0].state)
        state.replicas.extend(answers)
        return state

    async def report_outcomes(self, req: pb.ReportOutcomesRequest, client: Client,
                              headers: Mapping[str, str] | None = None) -> pb.ReportOutcomesResponse:
        """Each outcome to the replica that served its request, whose book
        knows the request (language, config, tokens).

        Which replica served a request is remembered here, from the stream
        that carried it (``served_by``, bounded like a replica's book), not
        found again by the request's session: a report carries no session,
        and spill-over may have sent the request elsewhere than the session's
        home. An outcome whose request is not remembered here goes to any
        replica, which counts it unknown, as a single server does.

        The ``request_id_prefix`` goes with each part: a replica that served a
        session's requests but gets none of their reports does not judge them
        never shown (undercounted, never overcounted). Each replica limits a
        client's outcome rate on its own."""
        check_report(req)  # whole batch: the error names the caller's index, not a part's
        if self.handle is None:
            raise RequestError("UNAVAILABLE", "the engine replicas are starting; retry shortly")
        parts: dict[str, list[pb.Outcome]] = {}
        for o in req.outcomes:
            parts.setdefault(self.served_by.get((client.user, o.request_id), ""), []).append(o)
        if not parts:
            parts[""] = []  # a prefix declaration alone
        carried = {k: v for k, v in (headers or {}).items() if k in FORWARDED_HEADERS}
        answers = await asyncio.gather(*(
            self.handle.report_outcomes.remote(pb.ReportOutcomesRequest(outcomes=outcomes, request_id_prefix=req.request_id_prefix)
                                               .SerializeToString(), client, carried, replica=replica)
            for replica, outcomes in parts.items()), return_exceptions=True)
        out = pb.ReportOutcomesResponse()
        for outcomes, answer in zip(parts.values(), answers):
            if isinstance(answer, BaseException):
                if not _is_replica_gone(answer):
                    log.error("outcome report failed on a replica", exc_info=answer)
                    raise RequestError("INTERNAL", f"replica call failed: {type(answer).__name__}") from answer
                out.unknown_request_ids += len(outcomes)  # its book went with it
            elif answer[0] == ERROR:
                raise refusal_error(answer)
            else:
                part = pb.ReportOutcomesResponse.FromString(answer[1])
                out.recorded += part.recorded
                out.unknown_request_ids += part.unknown_request_ids
                out.duplicates += part.duplicates
        return out

    async def outcome_stats(self) -> pb.OutcomeStats:
        answers = [pb.OutcomeStats.FromString(a) for a in await self.broadcast("outcome_stats") if isinstance(a, bytes)]
        if not answers:
            raise RequestError("UNAVAILABLE", "no engine replica answered; retry shortly")
        return merge_outcome_stats(answers)


def _figures(f: pb.OutcomeFigures) -> Figures:
    ended = f.accepted + f.rejected  # what mean_shown_ms is the mean over
    return Figures(shown=f.shown, accepted=f.accepted, partially_accepted=f.partially_accepted, rejected=f.rejected,
                   accepted_chars=f.accepted_chars, ended=ended, shown_ms=f.mean_shown_ms * ended,
                   wasted_cancelled=f.wasted_tokens_cancelled, wasted_never_shown=f.wasted_tokens_never_shown)


def merge_outcome_stats(parts: Sequence[pb.OutcomeStats]) -> pb.OutcomeStats:
    """The replicas' outcome figures as one server's: counts added, rates
    computed again from the sums. ``reporting_sessions`` is a sum too: a
    session whose reports went to two replicas counts twice."""
    total = Figures()
    groups: dict[tuple[str, str, str], Figures] = {}
    for p in parts:
        total.add(_figures(p.total))
        for g in p.groups:
            groups.setdefault((g.language, g.latency_class, g.speculative_config), Figures()).add(_figures(g))
    return pb.OutcomeStats(
        total=total.proto(), groups=[g.proto(key) for key, g in sorted(groups.items())],
        unknown_request_ids=sum(p.unknown_request_ids for p in parts), duplicates=sum(p.duplicates for p in parts),
        reporting_sessions=sum(p.reporting_sessions for p in parts), never_shown_grace_s=parts[0].never_shown_grace_s,
        since_unix_time=min(p.since_unix_time for p in parts))


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


class ReplicaPin:
    """PinSpeculation through replicas, in the place of ``SpeculationPin``:
    the pin goes to every replica, each applies it to its own engine and
    controller (``QuickdraftReplica.pin``), and it succeeds only when every
    serving replica applied it; otherwise the error names each replica that
    did not, and why. A replica whose engine does not serve is not a failure.

    The front end keeps the pin once any replica applied it (a release
    always), and the status poll (``poll``) gives it to each serving replica
    that lacks it and was not asked yet: replicas Ray started or replaced
    since, or that did not serve then. One that refused it is not asked again
    until the next PinSpeculation."""

    def __init__(self, service: RoutedService):
        self.service = service
        self.pinned: SpecConfig | None = None
        self.allow_rebuild = False
        self.asked: set[str] = set()  # replica ids that answered for the current pin
        self._lock = asyncio.Lock()
        self._task: asyncio.Task | None = None

    async def set(self, config: str, allow_rebuild: bool = False) -> tuple[str, float]:
        """As ``SpeculationPin.set``: (how it was applied, milliseconds), the
        most disruptive way any replica applied it and the longest time."""
        try:
            spec = SpecConfig.parse(config) if config.strip() else None
        except ValueError as e:
            raise RequestError("INVALID_ARGUMENT", str(e), field="config") from None
        async with self._lock:
            answers = await self._send(config, allow_rebuild)
            applied = [a for a in answers if "applied" in a]
            failed = sorted((a for a in answers if "code" in a and a["code"] != NOT_SERVING), key=lambda a: a["replica_id"])
            if applied or spec is None:
                self.pinned, self.allow_rebuild = spec, allow_rebuild
                self.asked = {a["replica_id"] for a in answers if a.get("code") != NOT_SERVING}
        try:
            await self.service.refresh()  # the answer's config is what runs now
        except Exception:  # noqa: BLE001 - the pin is applied; the reply shows the last poll's config
            log.exception("replica status poll after a pin failed")
        if failed:
            done = ", ".join(f"{a['replica_id']} ({a['applied']})" for a in applied)
            raise RequestError(failed[0]["code"], (f"pin {spec.label()}: " if spec else "release: ") + (f"applied on {done}; " if done else "")
                               + "not on " + "; ".join(f"{a['replica_id']}: {a['code']}: {a['message']}" for a in failed)
                               + (". Pin again (replicas that have it stay unchanged), or release it" if applied else ""))
        if not applied:
            raise RequestError("UNAVAILABLE", "no engine replica is serving yet; pin once the server is ready")
        return max((a["applied"] for a in applied), key=APPLIED_ORDER.index), max(a["switch_ms"] for a in applied)

    async def _send(self, config: str, allow_rebuild: bool) -> list[dict]:
        answers = await self.service.broadcast("pin", config, allow_rebuild)
        return [a if isinstance(a, dict) else {"replica_id": "a replica", "code": "UNAVAILABLE",
                                               "message": f"did not answer ({type(a).__name__}: {a})"} for a in answers]

    def behind(self) -> list[str]:
        """Serving replicas, as last polled, that lack the front end's pin and were not asked for it."""
        want = self.pinned.label() if self.pinned else ""
        return [s["replica_id"] for s in self.service.statuses
                if s.get("serving") and s.get("pinned", "") != want and s.get("replica_id") not in self.asked]

    def poll(self) -> None:
        """After each status poll: catch up in the background (a rebuild takes minutes; the poll goes on)."""
        if (self._task is None or self._task.done()) and self.behind():
            self._task = asyncio.create_task(self.catch_up(), name="replica-pin")

    async def catch_up(self) -> None:
        """The pin again to every replica: those that have it answer unchanged, the others apply it."""
        if self._lock.locked() or not self.behind():
            return  # an operator's pin is on its way to every replica
        async with self._lock:
            config = self.pinned.label() if self.pinned else ""
            try:
                answers = await self._send(config, self.allow_rebuild)
            except Exception:  # noqa: BLE001 - the next poll tries again
                log.exception("could not send the pin to the replicas")
                return
            for a in answers:
                if a.get("code") == NOT_SERVING:
                    continue
                self.asked.add(a["replica_id"])
                if "code" in a:
                    log.warning("replica %s did not take the pin (%s): %s: %s", a["replica_id"], config or "release", a["code"], a["message"])
                elif a["applied"] != "unchanged":
                    log.info("replica %s took the pin (%s): %s", a["replica_id"], config or "release", a["applied"])


class RoutedServicer(CompletionServicer):
    """The single-process servicer, with the calls that await replicas (the
    base class answers these from the process itself, synchronously)."""

    service: RoutedService

    async def GetControllerState(self, request, context):
        try:
            return await self.service.controller_states()
        except RequestError as e:
            await context.abort(grpc.StatusCode[e.code], e.message)

    async def ReportOutcomes(self, request, context):
        await abort_unparsed(request, context)
        md, client = self.caller(context)
        try:
            return await self.service.report_outcomes(request, client, md)
        except RequestError as e:
            await context.abort(grpc.StatusCode[e.code], e.message)

    async def GetOutcomeStats(self, request, context):
        try:
            return await self.service.outcome_stats()
        except RequestError as e:
            await context.abort(grpc.StatusCode[e.code], e.message)


def front_end(cfg: QuickdraftConfig, service: RoutedService, auth: Auth) -> GrpcServer:
    """The single-process server's gRPC listener (auth, TLS, health,
    reflection) around ``service``, with ``RoutedServicer`` for its servicer."""
    return GrpcServer(cfg, service, auth, servicer=RoutedServicer(service, auth, pin=service.pin))  # type: ignore[arg-type]


def http_front_end(cfg: QuickdraftConfig, service: RoutedService, auth: Auth) -> HttpServer:
    """The single-process server's HTTP API (routes, auth, limits, errors,
    hang-ups) over ``service``; outcome reports go to the replica that served
    each request, as over gRPC."""
    from quickdraft.server.openai.api_router import build_app
    from quickdraft.server.openai.http_server import HttpServer
    from quickdraft.server.openai.serving import OpenAIServing

    return HttpServer(cfg, build_app(OpenAIServing(cfg, service, auth, outcomes=service)))


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
    """``quickdraft serve --replicas N``: Ray, the replica deployment, and the
    front ends (gRPC, and HTTP with ``http.enabled``)."""

    POLL_S = 1.0

    def __init__(self, cfg: QuickdraftConfig):
        check_replicas_config(cfg)
        self.cfg = cfg
        self.telemetry = Telemetry(cfg.preset.name, cfg.telemetry.metrics_port, cfg.telemetry.metrics_host, cfg.telemetry.otlp_endpoint)
        self.auth = Auth.from_config(cfg)
        self.service: RoutedService | None = None
        self.metrics = ReplicaMetrics(self.telemetry, lambda: self.service.statuses if self.service else [])
        self.grpc: GrpcServer | None = None
        self.http: HttpServer | None = None
        self.port = 0
        self._poller: asyncio.Task | None = None
        self._stop = asyncio.Event()
        self._owns_ray = False

    async def start(self) -> int:
        """Bind the gRPC port (NOT_SERVING) and the HTTP one (503 on /health),
        start Ray and the replicas; serving once one replica serves."""
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
        if self.cfg.http.enabled:
            self.http = http_front_end(self.cfg, self.service, self.auth)
            await self.http.start()
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
            self.service.pin.poll()

    async def shutdown(self, grace_s: float | None = None) -> None:
        from ray import serve

        grace = self.cfg.server.grace_period_s if grace_s is None else grace_s
        if self._poller:
            self._poller.cancel()
        if self.service:
            self.service.stop_accepting()
        if self.grpc:
            await self.grpc.drain()
        # Both front ends drain together, within one grace period.
        stops = [self.grpc.stop(grace)] if self.grpc else []
        if self.http:
            stops.append(self.http.stop())
        await asyncio.gather(*stops)
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
        if self.auth.per_user:
            loop.add_signal_handler(signal.SIGHUP, self.reload_users)

    def reload_users(self) -> None:
        """SIGHUP: re-read security.auth_tokens_file, as the single-process
        server does (a broken file keeps the old users). Auth is the front
        end's alone: the replicas check no tokens."""
        try:
            self.auth.reload()
        except Exception:  # noqa: BLE001 - a reload must never take the server down
            log.exception("tokens file reload failed; keeping the users loaded before")

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
        http = f", HTTP on {self.cfg.http.host}:{self.http.port}" if self.http else ""
        print(f"quickdraft: gRPC on {self.cfg.server.host}:{self.port}{http}, {self.cfg.replicas.count} replicas of "
              f"{self.cfg.preset.name} (Ray Serve, routed {routed})", flush=True)
        await stop.wait()
        await self.shutdown()
        return 0
