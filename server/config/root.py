"""QuickdraftConfig: the root of the config tree, one section per concern,
and the values derived from the preset."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from quickdraft.server.config import validation
from quickdraft.server.config.controller import ControllerConfig
from quickdraft.server.config.engine import EngineConfig, detect_device
from quickdraft.server.config.errors import ConfigError
from quickdraft.server.config.http import HttpConfig
from quickdraft.server.config.limits import LimitsConfig
from quickdraft.server.config.model import ModelConfig
from quickdraft.server.config.replicas import ReplicasConfig
from quickdraft.server.config.security import SecurityConfig
from quickdraft.server.config.server import ServerConfig
from quickdraft.server.config.speculation import SpeculationConfig
from quickdraft.server.config.telemetry import TelemetryConfig
from quickdraft.server.presets import CUSTOM, PRESETS, Preset, custom_preset
from quickdraft.server.speculative import SpecConfig


@dataclass
class QuickdraftConfig:
    """The whole server configuration (docs/configuration.md)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    speculation: SpeculationConfig = field(default_factory=SpeculationConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    replicas: ReplicasConfig = field(default_factory=ReplicasConfig)

    # --- derived from the preset --------------------------------------------

    @property
    def preset(self) -> Preset:
        if self.model.preset == CUSTOM:
            return custom_preset(self.model.target or "", self.model.drafter, self.model.parallel_drafter)
        if self.model.preset not in PRESETS:
            raise ConfigError(f"model.preset: unknown preset {self.model.preset!r}; choose one of {', '.join([*PRESETS, CUSTOM])}")
        preset = PRESETS[self.model.preset]
        if preset.cached_model:  # the cache folder as the environment names it now, not at import
            from quickdraft.server import model_cache

            preset = dataclasses.replace(preset, target=str(model_cache.model_dir(preset.cached_model)))
        return preset

    def num_speculative_tokens(self) -> int:
        k = self.speculation.num_speculative_tokens
        return self.preset.num_speculative_tokens if k is None else k

    def parallel_drafting(self) -> bool:
        p = self.speculation.parallel_drafting
        return self.preset.parallel_drafting if p is None else p

    def spec_config(self) -> SpecConfig:
        """The configured speculative setting ([speculation]) as the one type."""
        s = self.speculation
        if not s.enabled:
            return SpecConfig.off()
        if s.per_batch_size:
            return SpecConfig.scheduled(self.parallel_drafting(), s.per_batch_size)
        return SpecConfig(self.parallel_drafting(), self.num_speculative_tokens())

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

    def max_prompt_chars(self) -> int:
        return self.limits.max_prompt_chars or self.max_prompt_tokens() * 8

    def device(self) -> str:
        if self.engine.device != "auto":
            return self.engine.device
        return detect_device()

    def validate(self, check_files: bool = True, check_vllm: bool = True) -> None:
        """Raise ConfigError for the first setting that is wrong (validation.py)."""
        validation.validate(self, check_files=check_files, check_vllm=check_vllm)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
