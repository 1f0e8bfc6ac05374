from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LatencyClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LATENCY_CLASS_UNSPECIFIED: _ClassVar[LatencyClass]
    LATENCY_CLASS_INLINE: _ClassVar[LatencyClass]
    LATENCY_CLASS_CHAT: _ClassVar[LatencyClass]
    LATENCY_CLASS_BATCH: _ClassVar[LatencyClass]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORTED: _ClassVar[FinishReason]
LATENCY_CLASS_UNSPECIFIED: LatencyClass
LATENCY_CLASS_INLINE: LatencyClass
LATENCY_CLASS_CHAT: LatencyClass
LATENCY_CLASS_BATCH: LatencyClass
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORTED: FinishReason

class ContextFile(_message.Message):
    __slots__ = ("path", "content")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    path: str
    content: str
    def __init__(self, path: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("request_id", "prefix", "suffix", "context_files", "language_id", "file_path", "repo_name", "max_tokens", "temperature", "top_p", "stop", "seed", "latency_class", "raw_prompt")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    SUFFIX_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FILES_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_ID_FIELD_NUMBER: _ClassVar[int]
    FILE_PATH_FIELD_NUMBER: _ClassVar[int]
    REPO_NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    LATENCY_CLASS_FIELD_NUMBER: _ClassVar[int]
    RAW_PROMPT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prefix: str
    suffix: str
    context_files: _containers.RepeatedCompositeFieldContainer[ContextFile]
    language_id: str
    file_path: str
    repo_name: str
    max_tokens: int
    temperature: float
    top_p: float
    stop: _containers.RepeatedScalarFieldContainer[str]
    seed: int
    latency_class: LatencyClass
    raw_prompt: bool
    def __init__(self, request_id: _Optional[str] = ..., prefix: _Optional[str] = ..., suffix: _Optional[str] = ..., context_files: _Optional[_Iterable[_Union[ContextFile, _Mapping]]] = ..., language_id: _Optional[str] = ..., file_path: _Optional[str] = ..., repo_name: _Optional[str] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., stop: _Optional[_Iterable[str]] = ..., seed: _Optional[int] = ..., latency_class: _Optional[_Union[LatencyClass, str]] = ..., raw_prompt: _Optional[bool] = ...) -> None: ...

class SpeculativeStats(_message.Message):
    __slots__ = ("enabled", "parallel_drafting", "num_speculative_tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position", "mean_acceptance_length", "config", "live_switches", "config_at_end", "estimated_from_engine")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_DRAFTING_FIELD_NUMBER: _ClassVar[int]
    NUM_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFTS_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_PER_POSITION_FIELD_NUMBER: _ClassVar[int]
    MEAN_ACCEPTANCE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    LIVE_SWITCHES_FIELD_NUMBER: _ClassVar[int]
    CONFIG_AT_END_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_FROM_ENGINE_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    parallel_drafting: bool
    num_speculative_tokens: int
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_position: _containers.RepeatedScalarFieldContainer[int]
    mean_acceptance_length: float
    config: str
    live_switches: int
    config_at_end: str
    estimated_from_engine: bool
    def __init__(self, enabled: _Optional[bool] = ..., parallel_drafting: _Optional[bool] = ..., num_speculative_tokens: _Optional[int] = ..., num_drafts: _Optional[int] = ..., num_draft_tokens: _Optional[int] = ..., num_accepted_tokens: _Optional[int] = ..., accepted_per_position: _Optional[_Iterable[int]] = ..., mean_acceptance_length: _Optional[float] = ..., config: _Optional[str] = ..., live_switches: _Optional[int] = ..., config_at_end: _Optional[str] = ..., estimated_from_engine: _Optional[bool] = ...) -> None: ...

class CompleteFinal(_message.Message):
    __slots__ = ("finish_reason", "prompt_tokens", "completion_tokens", "ttft_ms", "tpot_ms", "e2e_ms", "speculative", "request_id")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    E2E_MS_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    ttft_ms: float
    tpot_ms: float
    e2e_ms: float
    speculative: SpeculativeStats
    request_id: str
    def __init__(self, finish_reason: _Optional[_Union[FinishReason, str]] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., ttft_ms: _Optional[float] = ..., tpot_ms: _Optional[float] = ..., e2e_ms: _Optional[float] = ..., speculative: _Optional[_Union[SpeculativeStats, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ("text", "final")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    text: str
    final: CompleteFinal
    def __init__(self, text: _Optional[str] = ..., final: _Optional[_Union[CompleteFinal, _Mapping]] = ...) -> None: ...

class GetServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SpeculativeConfig(_message.Message):
    __slots__ = ("method", "drafter", "num_speculative_tokens", "parallel_drafting", "per_batch_size", "label", "live", "live_max_num_speculative_tokens", "live_switches")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    NUM_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_DRAFTING_FIELD_NUMBER: _ClassVar[int]
    PER_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    LIVE_MAX_NUM_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LIVE_SWITCHES_FIELD_NUMBER: _ClassVar[int]
    method: str
    drafter: str
    num_speculative_tokens: int
    parallel_drafting: bool
    per_batch_size: _containers.RepeatedCompositeFieldContainer[BatchSizeK]
    label: str
    live: bool
    live_max_num_speculative_tokens: int
    live_switches: int
    def __init__(self, method: _Optional[str] = ..., drafter: _Optional[str] = ..., num_speculative_tokens: _Optional[int] = ..., parallel_drafting: _Optional[bool] = ..., per_batch_size: _Optional[_Iterable[_Union[BatchSizeK, _Mapping]]] = ..., label: _Optional[str] = ..., live: _Optional[bool] = ..., live_max_num_speculative_tokens: _Optional[int] = ..., live_switches: _Optional[int] = ...) -> None: ...

class PinSpeculationRequest(_message.Message):
    __slots__ = ("config", "allow_rebuild")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    ALLOW_REBUILD_FIELD_NUMBER: _ClassVar[int]
    config: str
    allow_rebuild: bool
    def __init__(self, config: _Optional[str] = ..., allow_rebuild: _Optional[bool] = ...) -> None: ...

class PinSpeculationResponse(_message.Message):
    __slots__ = ("config", "pinned", "applied", "switch_ms")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    SWITCH_MS_FIELD_NUMBER: _ClassVar[int]
    config: SpeculativeConfig
    pinned: bool
    applied: str
    switch_ms: float
    def __init__(self, config: _Optional[_Union[SpeculativeConfig, _Mapping]] = ..., pinned: _Optional[bool] = ..., applied: _Optional[str] = ..., switch_ms: _Optional[float] = ...) -> None: ...

class BatchSizeK(_message.Message):
    __slots__ = ("min_batch_size", "max_batch_size", "num_speculative_tokens")
    MIN_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    min_batch_size: int
    max_batch_size: int
    num_speculative_tokens: int
    def __init__(self, min_batch_size: _Optional[int] = ..., max_batch_size: _Optional[int] = ..., num_speculative_tokens: _Optional[int] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ("max_concurrent_streams", "max_prompt_tokens", "max_output_tokens", "max_context_files", "max_request_bytes", "max_stop_sequences", "prompt_budget_tokens", "chars_per_token")
    MAX_CONCURRENT_STREAMS_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FILES_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUEST_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_STOP_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CHARS_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    max_concurrent_streams: int
    max_prompt_tokens: int
    max_output_tokens: int
    max_context_files: int
    max_request_bytes: int
    max_stop_sequences: int
    prompt_budget_tokens: int
    chars_per_token: float
    def __init__(self, max_concurrent_streams: _Optional[int] = ..., max_prompt_tokens: _Optional[int] = ..., max_output_tokens: _Optional[int] = ..., max_context_files: _Optional[int] = ..., max_request_bytes: _Optional[int] = ..., max_stop_sequences: _Optional[int] = ..., prompt_budget_tokens: _Optional[int] = ..., chars_per_token: _Optional[float] = ...) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("server_version", "model", "drafter", "vllm_version", "hardware", "speculative", "limits", "prompt_format", "state", "preset")
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    VLLM_VERSION_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PRESET_FIELD_NUMBER: _ClassVar[int]
    server_version: str
    model: str
    drafter: str
    vllm_version: str
    hardware: str
    speculative: SpeculativeConfig
    limits: Limits
    prompt_format: str
    state: str
    preset: str
    def __init__(self, server_version: _Optional[str] = ..., model: _Optional[str] = ..., drafter: _Optional[str] = ..., vllm_version: _Optional[str] = ..., hardware: _Optional[str] = ..., speculative: _Optional[_Union[SpeculativeConfig, _Mapping]] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., prompt_format: _Optional[str] = ..., state: _Optional[str] = ..., preset: _Optional[str] = ...) -> None: ...

class GetControllerStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CandidateEstimate(_message.Message):
    __slots__ = ("config", "parallel_drafting", "num_speculative_tokens", "predicted_tpot_ms", "predicted_ttft_ms", "expected_acceptance_length", "samples")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_DRAFTING_FIELD_NUMBER: _ClassVar[int]
    NUM_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_ACCEPTANCE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    config: str
    parallel_drafting: bool
    num_speculative_tokens: int
    predicted_tpot_ms: float
    predicted_ttft_ms: float
    expected_acceptance_length: float
    samples: int
    def __init__(self, config: _Optional[str] = ..., parallel_drafting: _Optional[bool] = ..., num_speculative_tokens: _Optional[int] = ..., predicted_tpot_ms: _Optional[float] = ..., predicted_ttft_ms: _Optional[float] = ..., expected_acceptance_length: _Optional[float] = ..., samples: _Optional[int] = ...) -> None: ...

class ControllerDecision(_message.Message):
    __slots__ = ("unix_time", "from_config", "to_config", "reason", "action")
    UNIX_TIME_FIELD_NUMBER: _ClassVar[int]
    FROM_CONFIG_FIELD_NUMBER: _ClassVar[int]
    TO_CONFIG_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    unix_time: float
    from_config: str
    to_config: str
    reason: str
    action: str
    def __init__(self, unix_time: _Optional[float] = ..., from_config: _Optional[str] = ..., to_config: _Optional[str] = ..., reason: _Optional[str] = ..., action: _Optional[str] = ...) -> None: ...

class ControllerState(_message.Message):
    __slots__ = ("enabled", "active", "candidates", "decisions", "acceptance_per_position", "running_requests", "profile_path", "engine_rebuilds", "live_switches", "pinned")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_PER_POSITION_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_PATH_FIELD_NUMBER: _ClassVar[int]
    ENGINE_REBUILDS_FIELD_NUMBER: _ClassVar[int]
    LIVE_SWITCHES_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    active: SpeculativeConfig
    candidates: _containers.RepeatedCompositeFieldContainer[CandidateEstimate]
    decisions: _containers.RepeatedCompositeFieldContainer[ControllerDecision]
    acceptance_per_position: _containers.RepeatedScalarFieldContainer[float]
    running_requests: float
    profile_path: str
    engine_rebuilds: int
    live_switches: int
    pinned: str
    def __init__(self, enabled: _Optional[bool] = ..., active: _Optional[_Union[SpeculativeConfig, _Mapping]] = ..., candidates: _Optional[_Iterable[_Union[CandidateEstimate, _Mapping]]] = ..., decisions: _Optional[_Iterable[_Union[ControllerDecision, _Mapping]]] = ..., acceptance_per_position: _Optional[_Iterable[float]] = ..., running_requests: _Optional[float] = ..., profile_path: _Optional[str] = ..., engine_rebuilds: _Optional[int] = ..., live_switches: _Optional[int] = ..., pinned: _Optional[str] = ...) -> None: ...
