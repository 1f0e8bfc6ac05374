"""CompletionService: the completion logic, with no network in it.

The gRPC servicer and the OpenAI-compatible HTTP API are thin adapters over
``CompletionService.complete``; tests can drive it with a fake engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import AsyncIterator, Callable, Mapping

from quickdraft import __version__
from quickdraft.server.admission import Admission, Client
from quickdraft.server.config import QuickdraftConfig
from quickdraft.server.engine import EngineSnapshot, hardware_description, vllm_version
from quickdraft.server.engine_manager import EngineManager
from quickdraft.server.errors import RequestError
from quickdraft.server.preparation import prepare_off_loop
from quickdraft.server.speculative import SpecConfig
from quickdraft.server.telemetry import RequestRecord, Telemetry
from quickdraft.server.tokenizer_pool import TokenizerPool
from quickdraft.v1 import completion_pb2 as pb

log = logging.getLogger("quickdraft.requests")

# vLLM's finish reasons, which are also OpenAI's names for them.
FINISH_REASONS = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH, "abort": pb.FINISH_REASON_ABORTED}


@dataclass
class DecodeMeter:
    """Decode time and tokens summed over every stream, which the controller
    reads in windows (server/controller/measured.py): per stream, the time
    between two outputs and the tokens the second carried, i.e. the
    benchmarks' token-weighted TPOT, measured on the serving path."""

    decode_seconds: float = 0.0
    decode_tokens: int = 0
    first_tokens: deque = field(default_factory=lambda: deque(maxlen=1024))
    """(latency class, TTFT seconds, perf_counter time) of recent first tokens."""


@dataclass
class Timing:
    """Server-side clock of one request (perf_counter seconds)."""

    arrival: float
    first: float | None = None
    last: float | None = None
    tokens: int = 0
    running_at_first: int = 0  # the engine's running requests at the first token: the load TTFT met
    meter: DecodeMeter | None = None
    latency_class: str = "inline"

    def add(self, n: int, now: float) -> None:
        if n <= 0:
            return
        meter = self.meter
        if self.first is None:
            self.first = now
            if meter is not None:
                meter.first_tokens.append((self.latency_class, now - self.arrival, now))
        elif meter is not None:
            meter.decode_seconds += now - self.last
            meter.decode_tokens += n
        self.last = now
        self.tokens += n

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.arrival

    @property
    def tpot(self) -> float | None:
        if self.tokens < 2 or self.first is None:
            return None
        return (self.last - self.first) / (self.tokens - 1)


class IndentStrip:
    """Drops the indentation a client typed (``PreparedRequest.typed_indent``)
    from the start of a completion asked from its line's start: the spaces and
    tabs leading the answer's first line, up to ``left`` of them. Deeper
    indentation is kept; code or a line break ends the strip at once. A delta
    of only such whitespace, which tokens may split, is swallowed whole (all
    of it is within the typed width, so dropped anyway) and the rest of the
    width carries to the next delta: no buffer, one counter per request."""

    __slots__ = ("left",)

    def __init__(self, width: int) -> None:
        self.left = width

    def feed(self, text: str) -> str:
        left, n, i = self.left, len(text), 0
        while i < left and i < n and text[i] in " \t":
            i += 1
        # All of it was whitespace and the width is not used up: more may follow.
        self.left = left - i if i == n else 0
        return text[i:] if i else text


def speculative_stats(metrics, spec: SpecConfig, switched_to: SpecConfig | None = None, switches: int = 0) -> pb.SpeculativeStats:
    """Per-request figures from vLLM's per-request histogram (accepted drafts
    per verify step). ``spec`` is the setting the request started with;
    ``switches`` live switches during the request left it on ``switched_to``."""
    enabled = spec.enabled or (switched_to is not None and switched_to.enabled)
    k = max(spec.k, switched_to.k if switched_to is not None else 0)
    stats = pb.SpeculativeStats(enabled=enabled, parallel_drafting=spec.parallel, num_speculative_tokens=spec.k,
                                config=spec.label(), live_switches=switches)
    if switches and switched_to is not None:
        stats.config_at_end = switched_to.label()
    if metrics is None or not enabled:
        return stats
    hist = list(metrics.histogram)
    stats.num_drafts = sum(hist)
    stats.num_draft_tokens = metrics.num_draft_tokens
    stats.num_accepted_tokens = sum(j * c for j, c in enumerate(hist))
    positions = [sum(hist[p:]) for p in range(1, len(hist))]
    # A live engine's histogram is as long as its largest K: past the K the
    # request ran with, only positions a switch during the request drafted are reported.
    while len(positions) > k and not positions[-1]:
        positions.pop()
    stats.accepted_per_position.extend(positions)
    if stats.num_drafts:
        stats.mean_acceptance_length = 1.0 + stats.num_accepted_tokens / stats.num_drafts
    stats.estimated_from_engine = bool(getattr(metrics, "estimated", False))
    return stats


def engine_window_metrics(before: EngineSnapshot, after: EngineSnapshot, output_tokens: int) -> SimpleNamespace | None:
    """Per-request figures where vLLM gives none (0.24 has no
    ``per_request_spec_decode_metrics``): the engine's drafts and per-position
    acceptance over the request's life, scaled to the request's verify steps
    (its tokens after the first, at the window's mean accepted length).
    Shaped like vLLM's per-request metrics (``histogram``, ``num_draft_tokens``)."""
    drafts = after.drafts - before.drafts
    if drafts <= 0 or output_tokens < 2:
        return None
    per_pos = [a - (before.accepted_per_position[i] if i < len(before.accepted_per_position) else 0)
               for i, a in enumerate(after.accepted_per_position)]
    mean_accepted = sum(per_pos) / drafts
    steps = max(1, round((output_tokens - 1) / (1.0 + mean_accepted)))
    at_least = [1.0] + [min(1.0, max(0.0, n / drafts)) for n in per_pos] + [0.0]  # P(accepted >= j)
    hist = [round(steps * (at_least[j] - at_least[j + 1])) for j in range(len(at_least) - 1)]
    hist[0] += steps - sum(hist)
    if hist[0] < 0:
        return None
    mean_k = (after.draft_tokens - before.draft_tokens) / drafts
    return SimpleNamespace(histogram=hist, num_draft_tokens=round(steps * mean_k), estimated=True)


@dataclass
class Observers:
    """Called once per finished request (controller, benchmarks)."""

    callbacks: list[Callable[[RequestRecord, pb.SpeculativeStats], None]] = field(default_factory=list)

    def __call__(self, record: RequestRecord, spec: pb.SpeculativeStats) -> None:
        for cb in self.callbacks:
            try:
                cb(record, spec)
            except Exception:  # noqa: BLE001 - an observer must not fail a request
                log.exception("request observer failed")


class CompletionService:
    def __init__(self, cfg: QuickdraftConfig, engines: EngineManager, telemetry: Telemetry, admission: Admission | None = None):
        self.cfg = cfg
        self.engines = engines
        self.telemetry = telemetry
        self.admission = admission or Admission(cfg.limits.max_concurrent_streams, cfg.limits.max_streams_per_client)
        self.tokenizer_pool = TokenizerPool(cfg.limits.tokenizer_threads, cfg.limits.tokenizer_share)
        self.observers = Observers()
        self.meter = DecodeMeter()

    def stop_accepting(self) -> None:
        """Shutdown: new streams are refused (UNAVAILABLE); open ones run on."""
        self.admission.accepting = False

    def health(self) -> tuple[bool, str]:
        """(serving, state): serving while the engine serves and new streams are
        accepted; otherwise the state says why not (starting, restarting, draining, ...)."""
        if not self.admission.accepting:
            return False, "draining"  # the engine still serves the last streams
        return self.engines.serving, self.engines.state

    def refused(self, code: str, user: str = "anonymous") -> None:
        """Count a request a front end refused before it reached complete()
        (unparsable, unauthenticated, unsupported), with the service's own refusals."""
        self.telemetry.reject(code, user=user)

    async def complete(self, req: pb.CompleteRequest, client: Client | str = "anonymous", headers: Mapping[str, str] | None = None) -> AsyncIterator[pb.CompleteResponse]:
        """Stream one completion: text deltas, then a final message.

        ``client`` is who asks (a plain string is a per-client limits key); ``headers`` the call's gRPC
        metadata or HTTP headers, whose W3C trace context parents the request's span.
        Raises RequestError before the first message for refused requests; a
        cancelled caller (task cancellation or generator close) aborts the
        engine request at once.
        """
        timing = Timing(arrival=time.perf_counter(), meter=self.meter)
        trace_context = self.telemetry.trace_context(headers or {})
        client = client if isinstance(client, Client) else Client(client)
        try:
            with self.admission.admit(client):
                async with self.engines.lease() as engine:
                    prepared = await prepare_off_loop(req, self.cfg, engine.prompt_tokens, self.tokenizer_pool, client.key)
                    # aclosing: when our caller closes us, the inner stream closes (and
                    # aborts the engine request) now, not when it is garbage-collected.
                    async with contextlib.aclosing(self._stream(engine, prepared, timing, trace_context, client.user, req.language_id)) as stream:
                        async for msg in stream:
                            yield msg
        except RequestError as e:
            self.telemetry.reject(e.code, user=client.user)
            raise

    async def _stream(self, engine, prepared, timing: Timing, trace_context, user: str, language: str = "") -> AsyncIterator[pb.CompleteResponse]:
        engine_id = f"{prepared.request_id}-{uuid.uuid4().hex[:8]}"
        sampling = prepared.sampling.to_vllm(engine.stop_token_ids)
        started_spec, started_switches = engine.spec, engine.switches  # a live switch may change them mid-request
        timing.latency_class = prepared.latency_class
        # vLLM without per-request counters (0.24): the engine's over this request's life instead.
        window = None if getattr(engine, "per_request_metrics", True) else dataclasses.replace(
            engine.snapshot, accepted_per_position=list(engine.snapshot.accepted_per_position))
        finish = "cancelled"
        spec_metrics = None
        finished = False
        attributes = {
            "gen_ai.request.model": self.cfg.preset.name,
            "quickdraft.request_id": prepared.request_id,
            "quickdraft.latency_class": prepared.latency_class,
            "enduser.id": user,
            "gen_ai.usage.input_tokens": prepared.prompt_tokens,
        }
        if self.cfg.telemetry.log_source_code:
            attributes["quickdraft.prompt_token_ids"] = str(prepared.prompt_token_ids[:256])
        span = self.telemetry.tracer.start_span("gen_ai.text_completion", context=trace_context, attributes=attributes)
        # Asked from a blank line's start (preparation.blank_line_from_line_start):
        # the client already has the indentation the model writes again.
        strip = IndentStrip(len(prepared.typed_indent)) if prepared.typed_indent else None
        try:
            try:
                async for out in engine.generate(engine_id, prepared.prompt_token_ids, sampling):
                    c = out.outputs[0]
                    if timing.first is None and c.token_ids:
                        timing.running_at_first = engine.snapshot.running
                    timing.add(len(c.token_ids), time.perf_counter())
                    if c.finish_reason is not None:
                        finish = c.finish_reason
                        spec_metrics = getattr(c, "spec_decode_metrics", None)
                        if spec_metrics is None and window is not None:
                            spec_metrics = engine_window_metrics(window, engine.snapshot, timing.tokens)
                        finished = True
                    text = c.text
                    if text and strip is not None and strip.left:
                        text = strip.feed(text)
                    if text:
                        yield pb.CompleteResponse(text=text)
            except RequestError:
                raise
            except Exception as e:  # noqa: BLE001
                finish = "error"
                if engine.dead:
                    raise RequestError("UNAVAILABLE", "the engine stopped while generating; retry (the server restarts it)") from e
                log.exception("request %s failed", prepared.request_id)
                raise RequestError("INTERNAL", f"generation failed: {type(e).__name__}") from e
            spec = speculative_stats(spec_metrics, started_spec, engine.spec, engine.switches - started_switches)
            final = pb.CompleteFinal(
                finish_reason=FINISH_REASONS.get(finish, pb.FINISH_REASON_UNSPECIFIED),
                prompt_tokens=prepared.prompt_tokens,
                completion_tokens=timing.tokens,
                ttft_ms=(timing.ttft or 0.0) * 1000,
                tpot_ms=(timing.tpot or 0.0) * 1000,
                e2e_ms=((timing.last or time.perf_counter()) - timing.arrival) * 1000,
                speculative=spec,
                request_id=prepared.request_id,
                prompt_fit=prepared.prompt_fit,
            )
            yield pb.CompleteResponse(final=final)
        finally:
            if not finished:
                # Cancelled or failed: make sure the engine stops working for nobody.
                try:
                    await asyncio.shield(engine.abort(engine_id))
                except BaseException:  # noqa: BLE001
                    pass
            spec = speculative_stats(spec_metrics, started_spec, engine.spec, engine.switches - started_switches)
            record = RequestRecord(
                latency_class=prepared.latency_class,
                ttft_s=timing.ttft,
                tpot_s=timing.tpot,
                duration_s=time.perf_counter() - timing.arrival,
                prompt_tokens=prepared.prompt_tokens,
                completion_tokens=timing.tokens,
                finish=finish,
                spec_label=started_spec.label(),
                accepted_per_position=list(spec.accepted_per_position),
                num_drafts=spec.num_drafts,
                running_at_first_token=timing.running_at_first,
                user=user,
                request_id=prepared.request_id,  # outcome reports (server/outcomes.py) name it
                language=language,
            )
            self.telemetry.record(record)
            self.observers(record, spec)
            span.set_attribute("gen_ai.usage.output_tokens", timing.tokens)
            span.set_attribute("quickdraft.finish", finish)
            if timing.ttft is not None:
                span.set_attribute("quickdraft.ttft_ms", timing.ttft * 1000)
            span.end()
            log.info(
                "request %s user=%s class=%s prompt_tokens=%d chars=%d sha=%s completion_tokens=%d ttft_ms=%s tpot_ms=%s finish=%s spec=%s accepted=%d/%d",
                prepared.request_id, user, prepared.latency_class, prepared.prompt_tokens, prepared.prompt_chars, prepared.prompt_sha,
                timing.tokens, _ms(timing.ttft), _ms(timing.tpot), finish, started_spec.label(), spec.num_accepted_tokens, spec.num_draft_tokens,
            )

    def server_info(self) -> pb.ServerInfo:
        cfg = self.cfg
        engine = self.engines.engine
        spec = pb.SpeculativeConfig(label="off")
        if engine is not None:
            running = engine.spec
            spec = pb.SpeculativeConfig(
                label=running.label(),
                live=engine.live,
                live_max_num_speculative_tokens=engine.max_k if engine.live else 0,
                live_switches=engine.switches,
            )
            if running.enabled:
                spec.method = "eagle3"
                spec.drafter = public_model_name(engine.drafter or "")
                spec.num_speculative_tokens = running.k
                spec.parallel_drafting = running.parallel
                spec.per_batch_size.extend(pb.BatchSizeK(min_batch_size=a, max_batch_size=b, num_speculative_tokens=k)
                                           for a, b, k in running.per_batch_size)
        lim = cfg.limits
        snap = getattr(engine, "snapshot", None)
        return pb.ServerInfo(
            server_version=__version__,
            model=public_model_name(cfg.target_path()),
            drafter=spec.drafter,
            vllm_version=vllm_version(),
            hardware=hardware_description(),
            speculative=spec,
            limits=pb.Limits(
                max_concurrent_streams=lim.max_concurrent_streams,
                max_prompt_tokens=cfg.max_prompt_tokens(),
                max_output_tokens=lim.max_output_tokens,
                max_context_files=lim.max_context_files,
                max_request_bytes=lim.max_request_bytes,
                max_stop_sequences=lim.max_stop_sequences,
                prompt_budget_tokens=cfg.prompt_budget_tokens(),
                chars_per_token=cfg.preset.chars_per_token,
            ),
            prompt_format=cfg.preset.prompt_format,
            state=self.engines.state,
            preset=cfg.preset.name,
            prefix_cache_queried_tokens=snap.prefix_cache_queries if snap is not None else 0,
            prefix_cache_hit_tokens=snap.prefix_cache_hits if snap is not None else 0,
        )


@functools.cache  # GetServerInfo runs on the event loop: stat and resolve once per name
def public_model_name(name: str) -> str:
    """A model as callers may see it: a hub id as it is; a local directory by
    its last two path parts, never the absolute path (it names users and hosts)."""
    if not name:
        return name
    p = Path(name).expanduser()
    if p.is_absolute() or name.startswith(".") or p.exists():
        return "/".join(p.resolve().parts[-2:])
    return name


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"
