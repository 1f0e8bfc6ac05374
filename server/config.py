"""Server configuration: one dataclass per concern, validated in one place.

Sources, later ones winning: the preset (``server/presets.py``), a TOML file
(``--config``), environment variables ``QUICKDRAFT_<SECTION>__<FIELD>`` (for
example ``QUICKDRAFT_SERVER__PORT=50052``), and command-line flags
(``--port``, ``--set speculation.num_speculative_tokens=3``).

Every field says what it means and its default. ``QuickdraftConfig.validate()``
checks everything that can be checked before the engine starts and raises
``ConfigError`` with a message that names the setting and how to fix it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from quickdraft.server.presets import CUSTOM, PRESETS, Preset, custom_preset


class ConfigError(ValueError):
    """A setting is wrong; the message names it and says how to fix it."""


@dataclass
class ModelConfig:
    """What to serve."""

    preset: str = "embedded"
    """Named model/drafter pair (server/presets.py): embedded,
    qwen3-coder-30b-p-eagle, gpt-oss-20b-p-eagle, gpt-oss-120b-p-eagle, or
    "custom" (then `target` and `drafter` are required)."""
    target: str | None = None
    """Target model: local directory or Hugging Face id. None: the preset's."""
    drafter: str | None = None
    """EAGLE-3 / P-EAGLE drafter: directory or id. None: the preset's."""
    parallel_drafter: str | None = None
    """Drafter used when parallel drafting is on, if it differs from
    `drafter` (the embedded preset ships one of each). None: the preset's."""
    dtype: str = "auto"
    """Weights/activations dtype for vLLM: auto (float32 on CPU, the
    checkpoint's on GPU), float32, bfloat16, float16."""
    max_model_len: int | None = None
    """Context window in tokens (prompt + completion). None: the preset's."""
    load_format: str = "auto"
    """vLLM load format; "dummy" serves random weights (timing studies only)."""
    revision: str | None = None
    """Model revision when `target` is a hub id."""
    tokenizer: str | None = None
    """Tokenizer directory or id. None: the target's. Set it when the target
    directory holds only a config.json (load_format = "dummy")."""


@dataclass
class SpeculationConfig:
    """Speculative decoding: the drafter proposes K tokens, the target verifies them in one step."""

    enabled: bool = True
    """False serves the target alone."""
    num_speculative_tokens: int | None = None
    """K: tokens drafted per verification step. None: the preset's (5 for the
    embedded and Qwen3-Coder presets)."""
    parallel_drafting: bool | None = None
    """True: P-EAGLE, all K drafts in one drafter pass (vLLM >= 0.16).
    False: EAGLE-3, K sequential drafter passes. None: the preset's."""
    per_batch_size: list[tuple[int, int, int]] | None = None
    """Optional K schedule by batch size: [(min_batch, max_batch, K), ...],
    inclusive; vLLM picks K each step from the number of scheduled requests."""
    rejection_sample_method: str = "standard"
    """"standard", or "synthetic" (accept at set rates; for timing studies
    with random weights; not supported by vLLM's CPU sampler)."""
    synthetic_acceptance_rates: list[float] | None = None
    """Per-position unconditional acceptance rates for "synthetic" (position
    1 first, non-increasing); the first K are used. Applies to autoregressive
    drafting, and to parallel drafting unless the next field is set."""
    synthetic_acceptance_rates_parallel: list[float] | None = None
    """As above, for parallel drafting (P-EAGLE accepts a little less per
    position than EAGLE-3). None: `synthetic_acceptance_rates`."""


@dataclass
class EngineConfig:
    """How vLLM runs."""

    device: str = "auto"
    """auto (a GPU when torch sees one, else the CPU build), cuda, or cpu."""
    tensor_parallel_size: int = 1
    """GPUs per model replica (vLLM tensor parallelism)."""
    data_parallel_size: int = 1
    """Model replicas (vLLM data parallelism). Past one machine use vLLM's
    multi-node serving (vLLM's own docs); quickdraft adds nothing there."""
    gpu_memory_utilization: float = 0.9
    """Share of GPU memory vLLM may take (GPU only)."""
    cpu_kv_cache_gib: int = 1
    """KV cache size on CPU, in whole GiB (sets VLLM_CPU_KVCACHE_SPACE, which vLLM reads as an integer)."""
    cpu_malloc_mmap_threshold_bytes: int = 0
    """glibc's mmap threshold for the CPU engine's processes (sets
    MALLOC_MMAP_THRESHOLD_ before vLLM spawns them): blocks at least this large
    get their own mapping and go back to the system when freed. A fixed value
    stops glibc from raising the threshold each time the worker frees a large
    tensor, which lets its memory grow with the variety of prompt lengths.
    1048576 (1 MiB) keeps it flat but costs speed: TTFT 1.2-1.3x at 1 stream,
    throughput 0.83x at 16 on the 2-core test machine (RELIABILITY.md, Load).
    0: leave glibc's dynamic threshold (or an operator's own
    MALLOC_MMAP_THRESHOLD_) alone. At most 32 MiB, glibc's cap."""
    max_num_seqs: int = 16
    """Requests the engine batches at once; more wait in its queue."""
    enforce_eager: bool | None = None
    """None: eager on CPU, CUDA graphs on GPU (as in production)."""
    seed: int = 0
    """Engine seed (sampled requests without their own seed)."""
    extra_args: dict[str, Any] = field(default_factory=dict)
    """Passed to vLLM's AsyncEngineArgs unchanged (e.g. {"enable_prefix_caching": true})."""


@dataclass
class ServerConfig:
    """The gRPC listener and process behaviour."""

    host: str = "127.0.0.1"
    """Address to bind. Anything but loopback needs `allow_remote = true`."""
    port: int = 50051
    """gRPC port; 0 picks a free one (printed at start)."""
    allow_remote: bool = False
    """Must be true to bind a non-loopback address: say so on purpose."""
    grace_period_s: float = 10.0
    """On SIGTERM: how long in-flight streams may finish before the exit."""
    max_message_bytes: int = 4 * 1024 * 1024
    """Largest gRPC message accepted or sent."""
    reflection: bool = True
    """gRPC server reflection, so generic tools (grpcurl) can call the API."""
    engine_restart: bool = True
    """Restart the engine automatically when it dies."""
    log_level: str = "INFO"


@dataclass
class LimitsConfig:
    """Admission control. Over a limit is RESOURCE_EXHAUSTED or INVALID_ARGUMENT, naming the limit."""

    max_concurrent_streams: int = 64
    """Completion streams open at once, all clients together."""
    max_streams_per_client: int = 32
    """Streams open at once per client (bearer token, or peer address)."""
    max_prompt_tokens: int | None = None
    """Longest rendered prompt. None: the preset's prompt budget plus room for context."""
    prompt_budget_tokens: int | None = None
    """Prompt size clients should aim for (announced in GetServerInfo). None: the preset's."""
    default_max_tokens: int = 64
    """Completion length when a request says 0."""
    max_output_tokens: int = 512
    """Largest max_tokens accepted."""
    max_context_files: int = 32
    max_stop_sequences: int = 16
    max_stop_length: int = 128
    max_request_bytes: int = 1024 * 1024
    """Largest CompleteRequest (prefix + suffix + context files)."""


@dataclass
class SecurityConfig:
    """Transport security and authentication (off by default; loopback only)."""

    tls_cert_file: str | None = None
    """PEM certificate chain; with `tls_key_file` turns on TLS."""
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    """PEM CA bundle; when set, clients must present a certificate it signed (mutual TLS)."""
    auth_token_file: str | None = None
    """File holding the bearer token clients must send ("authorization: Bearer ...")."""
    auth_token_env: str = "QUICKDRAFT_AUTH_TOKEN"
    """Environment variable holding the token, when no file is given. Never a
    flag: flags show in `ps`."""
    health_requires_auth: bool = False
    """False lets load balancers probe grpc.health.v1 without a token."""


@dataclass
class TelemetryConfig:
    """Metrics, traces and logs."""

    metrics_port: int = 9464
    """Prometheus scrape endpoint (/metrics, our metrics and vLLM's); 0 turns it off."""
    metrics_host: str = "127.0.0.1"
    otlp_endpoint: str | None = None
    """OTLP/gRPC collector for traces (e.g. http://127.0.0.1:4317); None: no export."""
    log_source_code: bool = False
    """Opt in to source code in logs and spans. Off: only sizes and hashes."""


@dataclass
class ControllerConfig:
    """The adaptive speculation controller (server/controller)."""

    enabled: bool = False
    """True: measure TTFT/TPOT and switch speculative configs at run time."""
    decide_every_s: float = 2.0
    """How often the controller samples the engine and decides (1-2 s lets it
    react within ~30 s of a load change, an engine rebuild included)."""
    ttft_slo_s: dict[str, float] = field(default_factory=lambda: {"inline": 0.3, "chat": 1.0, "batch": 10.0})
    """p95 TTFT target per latency class."""
    profile_dir: str | None = None
    """Where tuned profiles live. None: ~/.cache/quickdraft/profiles."""
    allow_rebuild: bool = True
    """Apply decisions that need a new engine (K or mode change) by rebuilding it."""
    standby_engines: int = 0
    """Engines kept warm for other configs: the one switched away from, and at
    start the controller's pick for a full batch when it needs another engine.
    A switch to a warm engine is instant instead of a rebuild (40-48 s on a
    2-core CPU). Each costs the model's memory and engine.cpu_kv_cache_gib
    (CPU) or its GPU memory share; an idle vLLM engine waits without using a
    core. 0: every switch rebuilds."""
    observations_file: str | None = None
    """Append every observation the controller takes to this file (JSON
    lines: ``t``, the controller clock's Unix time, and the Observation), to
    replay a live run offline (``Observation.from_dict``, ``sim.TraceEngine``).
    None: off."""


@dataclass
class HttpConfig:
    """OpenAI-compatible HTTP endpoint on the same engine (off by default)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 8000
    """Its own port; 0 picks a free one."""
    served_model_name: str | None = None
    """Model name in /v1/models. None: the preset's name."""


@dataclass
class QuickdraftConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    speculation: SpeculationConfig = field(default_factory=SpeculationConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    http: HttpConfig = field(default_factory=HttpConfig)

    # --- derived from the preset --------------------------------------------

    @property
    def preset(self) -> Preset:
        if self.model.preset == CUSTOM:
            return custom_preset(self.model.target or "", self.model.drafter, self.model.parallel_drafter)
        if self.model.preset not in PRESETS:
            raise ConfigError(f"model.preset: unknown preset {self.model.preset!r}; choose one of {', '.join([*PRESETS, CUSTOM])}")
        return PRESETS[self.model.preset]

    def num_speculative_tokens(self) -> int:
        k = self.speculation.num_speculative_tokens
        return self.preset.num_speculative_tokens if k is None else k

    def parallel_drafting(self) -> bool:
        p = self.speculation.parallel_drafting
        return self.preset.parallel_drafting if p is None else p

    def target_path(self) -> str:
        return self.model.target or self.preset.target

    def tokenizer_path(self) -> str:
        return self.model.tokenizer or self.target_path()

    def drafter_path(self, parallel: bool | None = None) -> str | None:
        parallel = self.parallel_drafting() if parallel is None else parallel
        if parallel:
            return self.model.parallel_drafter or self.model.drafter or self.preset.parallel_drafter or self.preset.drafter
        return self.model.drafter or self.preset.drafter

    def max_model_len(self) -> int:
        return self.model.max_model_len or self.preset.max_model_len

    def prompt_budget_tokens(self) -> int:
        return self.limits.prompt_budget_tokens or self.preset.prompt_budget_tokens

    def max_prompt_tokens(self) -> int:
        if self.limits.max_prompt_tokens:
            return self.limits.max_prompt_tokens
        return max(1, self.max_model_len() - 16)

    def device(self) -> str:
        if self.engine.device != "auto":
            return self.engine.device
        return detect_device()

    def validate(self, check_files: bool = True, check_vllm: bool = True) -> None:
        from quickdraft.server import validation

        validation.validate(self, check_files=check_files, check_vllm=check_vllm)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def detect_device() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return "cuda"
    except ImportError:
        pass
    return "cpu"


# --- loading ------------------------------------------------------------------

_SECTIONS = {f.name: f.type for f in dataclasses.fields(QuickdraftConfig)}


def _coerce(value: Any, hint: Any, name: str) -> Any:
    """Turn TOML/env/flag values into the field's type."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        non_none = [a for a in args if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            return None
        return _coerce(value, non_none[0], name)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name}: expected true or false, got {value!r}")
    if hint in (int, float):
        try:
            return hint(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected a number, got {value!r}") from None
    if hint is str:
        return str(value)
    if origin in (list, dict):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise ConfigError(f"{name}: expected JSON for a {origin.__name__}, got {value!r}") from None
        if origin is list and args and typing.get_origin(args[0]) is tuple:
            return [tuple(v) for v in value]
        return value
    return value


def _apply(cfg: QuickdraftConfig, section: str, key: str, value: Any, source: str) -> None:
    if section not in _SECTIONS:
        raise ConfigError(f"{source}: unknown section [{section}]; sections are {', '.join(_SECTIONS)}")
    obj = getattr(cfg, section)
    hints = typing.get_type_hints(type(obj))
    if key not in hints:
        raise ConfigError(f"{source}: unknown setting {section}.{key}; [{section}] has {', '.join(hints)}")
    setattr(obj, key, _coerce(value, hints[key], f"{source}: {section}.{key}"))


def load_config(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> QuickdraftConfig:
    """Defaults < TOML file < QUICKDRAFT_* environment < overrides ("section.key": value)."""
    cfg = QuickdraftConfig()
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"--config {path}: no such file")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"--config {path}: not valid TOML: {e}") from None
        for section, values in data.items():
            if not isinstance(values, dict):
                raise ConfigError(f"{path}: top-level key {section!r} must be a [section]")
            for key, value in values.items():
                _apply(cfg, section, key, value, str(path))
    env = os.environ if env is None else env
    for name, value in env.items():
        if not name.startswith("QUICKDRAFT_") or "__" not in name:
            continue
        section, _, key = name[len("QUICKDRAFT_") :].lower().partition("__")
        _apply(cfg, section, key, value, f"environment {name}")
    for dotted, value in (overrides or {}).items():
        section, _, key = dotted.partition(".")
        _apply(cfg, section, key, value, f"--set {dotted}")
    return cfg
