"""Metrics (OpenTelemetry, GenAI semantic-convention names) and traces.

Metrics go to a Prometheus scrape endpoint on their own port; the same
endpoint serves vLLM's own metrics (vLLM registers them in prometheus_client's
default registry). Trace context arrives in gRPC metadata or HTTP headers
(W3C traceparent).
Neither metric labels nor span attributes ever carry source code: only sizes,
counts and the latency class, unless telemetry.log_source_code is on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping

from opentelemetry.propagate import extract
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter

from quickdraft import __version__

log = logging.getLogger("quickdraft.telemetry")

# Seconds; fine at the low end, where editor latency lives.
LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0]
TOKEN_BUCKETS = [1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
# Seconds a suggestion stays on screen: a glance to a long read.
SCREEN_BUCKETS = [0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0]


@dataclass
class RequestRecord:
    """What one finished request reports to metrics."""

    latency_class: str
    ttft_s: float | None
    tpot_s: float | None
    duration_s: float
    prompt_tokens: int | None  # None: unknown (a replicas front end relaying a cancelled or failed stream)
    completion_tokens: int | None
    finish: str  # stop, length, cancelled, error
    spec_label: str
    accepted_per_position: list[int]
    num_drafts: int
    running_at_first_token: int = 0  # the engine's running requests when the first token came out (0: unknown)
    user: str = "anonymous"  # a tokens-file user id, never a token
    request_id: str = ""  # what outcome reports name the request by (server/outcomes.py)
    language: str = ""  # the request's language_id, as the client sent it


class Telemetry:
    def __init__(self, model_name: str, metrics_port: int = 0, metrics_host: str = "127.0.0.1", otlp_endpoint: str | None = None, span_exporter: SpanExporter | None = None,
                 metric_reader: MetricReader | None = None):
        resource = Resource.create({"service.name": "quickdraft", "service.version": __version__})
        readers = []
        self.metrics_port = 0
        if metrics_port:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import start_http_server

            readers.append(PrometheusMetricReader())
            server, _thread = start_http_server(metrics_port, addr=metrics_host)
            self.metrics_port = server.server_port
            self._http = server
            log.info("metrics on http://%s:%d/metrics", metrics_host, self.metrics_port)
        if metric_reader is not None:  # e.g. an InMemoryMetricReader in tests
            readers.append(metric_reader)
        views = [
            View(instrument_name="gen_ai.server.*", aggregation=ExplicitBucketHistogramAggregation(LATENCY_BUCKETS)),
            View(instrument_name="gen_ai.client.token.usage", aggregation=ExplicitBucketHistogramAggregation(TOKEN_BUCKETS)),
            View(instrument_name="quickdraft.suggestion.time_on_screen", aggregation=ExplicitBucketHistogramAggregation(SCREEN_BUCKETS)),
        ]
        self.meter_provider = MeterProvider(resource=resource, metric_readers=readers, views=views)
        meter = self.meter_provider.get_meter("quickdraft")
        self.model_name = model_name
        self.ttft = meter.create_histogram("gen_ai.server.time_to_first_token", unit="s", description="Time to generate the first token")
        self.tpot = meter.create_histogram("gen_ai.server.time_per_output_token", unit="s", description="Time per output token after the first")
        self.duration = meter.create_histogram("gen_ai.server.request.duration", unit="s", description="Request duration, arrival to last token")
        self.tokens = meter.create_histogram("gen_ai.client.token.usage", unit="{token}", description="Input and output tokens per request")
        self.requests = meter.create_counter("quickdraft.requests", unit="{request}", description="Finished requests by outcome")
        self.wasted = meter.create_counter("quickdraft.tokens.wasted", unit="{token}",
                                           description="Output tokens nobody used, by reason: cancelled (the request was cancelled before it finished) "
                                                       "or never_shown (it finished, and its editor did not report it shown)")
        # Suggestion outcomes, as editors report them (server/outcomes.py).
        self.suggestions_shown = meter.create_counter("quickdraft.suggestions.shown", unit="{suggestion}", description="Suggestions editors reported on screen")
        self.suggestions_accepted = meter.create_counter("quickdraft.suggestions.accepted", unit="{suggestion}",
                                                         description="Suggestions accepted, whole or by word or line (quickdraft.acceptance)")
        self.suggestions_rejected = meter.create_counter("quickdraft.suggestions.rejected", unit="{suggestion}",
                                                         description="Suggestions that left the screen with nothing taken (quickdraft.rejection)")
        self.accepted_chars = meter.create_counter("quickdraft.suggestions.accepted_chars", unit="{character}",
                                                   description="Characters users accepted; divided by quickdraft.suggestions.shown, accepted characters per shown suggestion")
        self.time_on_screen = meter.create_histogram("quickdraft.suggestion.time_on_screen", unit="s",
                                                     description="How long a suggestion was on screen before it was accepted or rejected")
        self.outcomes_unmatched = meter.create_counter("quickdraft.outcomes.unmatched", unit="{outcome}",
                                                       description="Outcome reports not counted: unknown request id, or a duplicate")
        self.rejected = meter.create_counter("quickdraft.requests.rejected", unit="{request}", description="Requests refused before reaching the engine, by status code")
        self.drafts = meter.create_counter("quickdraft.speculative.drafts", unit="{step}", description="Verification steps with drafts")
        self.accepted = meter.create_counter("quickdraft.speculative.accepted_tokens", unit="{token}", description="Accepted draft tokens by draft position (1-based)")
        self.engine_rebuilds = meter.create_counter("quickdraft.engine.rebuilds", unit="{rebuild}", description="Engine rebuilds (controller switches and restarts)")
        self.speculation_off = meter.create_counter("quickdraft.controller.fallbacks", unit="{event}", description="Controller fallbacks (speculation off, K reduced), by reason")
        self._base = {"gen_ai.operation.name": "text_completion", "gen_ai.request.model": model_name}

        self.tracer_provider = TracerProvider(resource=resource)
        if otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            self.tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint, insecure=True)))
        if span_exporter is not None:
            self.tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
        self.tracer = self.tracer_provider.get_tracer("quickdraft")

    def record(self, r: RequestRecord) -> None:
        attrs = {**self._base, "quickdraft.latency_class": r.latency_class, "quickdraft.speculative.config": r.spec_label}
        if r.ttft_s is not None:
            self.ttft.record(r.ttft_s, attrs)
        if r.tpot_s is not None:
            self.tpot.record(r.tpot_s, attrs)
        self.duration.record(r.duration_s, attrs)
        if r.prompt_tokens is not None:
            self.tokens.record(r.prompt_tokens, {**attrs, "gen_ai.token.type": "input"})
        if r.completion_tokens is not None:
            self.tokens.record(r.completion_tokens, {**attrs, "gen_ai.token.type": "output"})
        # The user only on counters: per-user histograms would multiply the series by the team's size.
        self.requests.add(1, {**attrs, "quickdraft.finish": r.finish, "enduser.id": r.user})
        if r.finish == "cancelled" and r.completion_tokens:
            # Editors cancel most requests as the user types on; this is what that costs the engine.
            self.wasted.add(r.completion_tokens, {**attrs, "quickdraft.waste.reason": "cancelled"})
        if r.num_drafts:
            self.drafts.add(r.num_drafts, attrs)
            for pos, n in enumerate(r.accepted_per_position, start=1):
                self.accepted.add(n, {**attrs, "quickdraft.draft_position": pos})

    def never_shown(self, tokens: int, latency_class: str, config: str) -> None:
        """A finished request's output that its (reporting) editor never showed."""
        self.wasted.add(tokens, {**self._base, "quickdraft.latency_class": latency_class, "quickdraft.speculative.config": config,
                                 "quickdraft.waste.reason": "never_shown"})

    def suggestion_shown(self, labels: Mapping[str, str]) -> None:
        """``labels``: quickdraft.language, quickdraft.latency_class, quickdraft.speculative.config."""
        self.suggestions_shown.add(1, {**self._base, **labels})

    def suggestion_accepted(self, labels: Mapping[str, str], acceptance: str, chars: int, shown_s: float) -> None:
        attrs = {**self._base, **labels}
        self.suggestions_accepted.add(1, {**attrs, "quickdraft.acceptance": acceptance})
        self.accepted_chars.add(chars, attrs)
        self.time_on_screen.record(shown_s, {**attrs, "quickdraft.outcome": "accepted"})

    def suggestion_rejected(self, labels: Mapping[str, str], rejection: str, shown_s: float) -> None:
        attrs = {**self._base, **labels}
        self.suggestions_rejected.add(1, {**attrs, "quickdraft.rejection": rejection})
        self.time_on_screen.record(shown_s, {**attrs, "quickdraft.outcome": "rejected"})

    def outcome_unmatched(self, reason: str) -> None:
        self.outcomes_unmatched.add(1, {**self._base, "quickdraft.reason": reason})

    def reject(self, code: str, latency_class: str = "unknown", user: str = "anonymous") -> None:
        self.rejected.add(1, {**self._base, "rpc.grpc.status_code": code, "quickdraft.latency_class": latency_class, "enduser.id": user})

    def trace_context(self, headers: Mapping[str, str]):
        """The caller's span context from W3C headers (gRPC metadata or HTTP headers)."""
        return extract(dict(headers))

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()
        if getattr(self, "_http", None) is not None:
            self._http.shutdown()
