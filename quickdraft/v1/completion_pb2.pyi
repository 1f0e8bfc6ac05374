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

class OutcomeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_KIND_UNSPECIFIED: _ClassVar[OutcomeKind]
    OUTCOME_KIND_SHOWN: _ClassVar[OutcomeKind]
    OUTCOME_KIND_ACCEPTED: _ClassVar[OutcomeKind]
    OUTCOME_KIND_REJECTED: _ClassVar[OutcomeKind]

class Acceptance(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACCEPTANCE_UNSPECIFIED: _ClassVar[Acceptance]
    ACCEPTANCE_WHOLE: _ClassVar[Acceptance]
    ACCEPTANCE_WORD: _ClassVar[Acceptance]
    ACCEPTANCE_LINE: _ClassVar[Acceptance]

class Rejection(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REJECTION_UNSPECIFIED: _ClassVar[Rejection]
    REJECTION_DISMISSED: _ClassVar[Rejection]
    REJECTION_TYPED_OVER: _ClassVar[Rejection]
    REJECTION_REPLACED: _ClassVar[Rejection]
LATENCY_CLASS_UNSPECIFIED: LatencyClass
LATENCY_CLASS_INLINE: LatencyClass
LATENCY_CLASS_CHAT: LatencyClass
LATENCY_CLASS_BATCH: LatencyClass
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORTED: FinishReason
OUTCOME_KIND_UNSPECIFIED: OutcomeKind
OUTCOME_KIND_SHOWN: OutcomeKind
OUTCOME_KIND_ACCEPTED: OutcomeKind
OUTCOME_KIND_REJECTED: OutcomeKind
ACCEPTANCE_UNSPECIFIED: Acceptance
ACCEPTANCE_WHOLE: Acceptance
ACCEPTANCE_WORD: Acceptance
ACCEPTANCE_LINE: Acceptance
REJECTION_UNSPECIFIED: Rejection
REJECTION_DISMISSED: Rejection
REJECTION_TYPED_OVER: Rejection
REJECTION_REPLACED: Rejection

class ContextFile(_message.Message):
    __slots__ = ("path", "content")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    path: str
    content: str
    def __init__(self, path: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("request_id", "prefix", "suffix", "context_files", "language_id", "file_path", "repo_name", "max_tokens", "temperature", "top_p", "stop", "seed", "latency_class", "raw_prompt", "strict_prompt", "session")
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
    STRICT_PROMPT_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
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
    strict_prompt: bool
    session: str
    def __init__(self, request_id: _Optional[str] = ..., prefix: _Optional[str] = ..., suffix: _Optional[str] = ..., context_files: _Optional[_Iterable[_Union[ContextFile, _Mapping]]] = ..., language_id: _Optional[str] = ..., file_path: _Optional[str] = ..., repo_name: _Optional[str] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., stop: _Optional[_Iterable[str]] = ..., seed: _Optional[int] = ..., latency_class: _Optional[_Union[LatencyClass, str]] = ..., raw_prompt: _Optional[bool] = ..., strict_prompt: _Optional[bool] = ..., session: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("finish_reason", "prompt_tokens", "completion_tokens", "ttft_ms", "tpot_ms", "e2e_ms", "speculative", "request_id", "prompt_fit")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    E2E_MS_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIT_FIELD_NUMBER: _ClassVar[int]
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    ttft_ms: float
    tpot_ms: float
    e2e_ms: float
    speculative: SpeculativeStats
    request_id: str
    prompt_fit: PromptFit
    def __init__(self, finish_reason: _Optional[_Union[FinishReason, str]] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., ttft_ms: _Optional[float] = ..., tpot_ms: _Optional[float] = ..., e2e_ms: _Optional[float] = ..., speculative: _Optional[_Union[SpeculativeStats, _Mapping]] = ..., request_id: _Optional[str] = ..., prompt_fit: _Optional[_Union[PromptFit, _Mapping]] = ...) -> None: ...

class PromptFit(_message.Message):
    __slots__ = ("truncated", "prefix_chars_cut", "suffix_chars_cut", "context_files_dropped", "prompt_tokens_cut")
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CHARS_CUT_FIELD_NUMBER: _ClassVar[int]
    SUFFIX_CHARS_CUT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FILES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_CUT_FIELD_NUMBER: _ClassVar[int]
    truncated: bool
    prefix_chars_cut: int
    suffix_chars_cut: int
    context_files_dropped: int
    prompt_tokens_cut: int
    def __init__(self, truncated: _Optional[bool] = ..., prefix_chars_cut: _Optional[int] = ..., suffix_chars_cut: _Optional[int] = ..., context_files_dropped: _Optional[int] = ..., prompt_tokens_cut: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("server_version", "model", "drafter", "vllm_version", "hardware", "speculative", "limits", "prompt_format", "state", "preset", "prefix_cache_queried_tokens", "prefix_cache_hit_tokens", "replicas")
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
    PREFIX_CACHE_QUERIED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
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
    prefix_cache_queried_tokens: int
    prefix_cache_hit_tokens: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    def __init__(self, server_version: _Optional[str] = ..., model: _Optional[str] = ..., drafter: _Optional[str] = ..., vllm_version: _Optional[str] = ..., hardware: _Optional[str] = ..., speculative: _Optional[_Union[SpeculativeConfig, _Mapping]] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., prompt_format: _Optional[str] = ..., state: _Optional[str] = ..., preset: _Optional[str] = ..., prefix_cache_queried_tokens: _Optional[int] = ..., prefix_cache_hit_tokens: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ...) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("replica_id", "state", "speculative_config", "open_streams", "max_streams", "predicted_ttft_ms", "ttft_source", "prefix_cache_queried_tokens", "prefix_cache_hit_tokens", "node")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_CONFIG_FIELD_NUMBER: _ClassVar[int]
    OPEN_STREAMS_FIELD_NUMBER: _ClassVar[int]
    MAX_STREAMS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    TTFT_SOURCE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_QUERIED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    state: str
    speculative_config: str
    open_streams: int
    max_streams: int
    predicted_ttft_ms: float
    ttft_source: str
    prefix_cache_queried_tokens: int
    prefix_cache_hit_tokens: int
    node: str
    def __init__(self, replica_id: _Optional[str] = ..., state: _Optional[str] = ..., speculative_config: _Optional[str] = ..., open_streams: _Optional[int] = ..., max_streams: _Optional[int] = ..., predicted_ttft_ms: _Optional[float] = ..., ttft_source: _Optional[str] = ..., prefix_cache_queried_tokens: _Optional[int] = ..., prefix_cache_hit_tokens: _Optional[int] = ..., node: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("enabled", "active", "candidates", "decisions", "acceptance_per_position", "running_requests", "profile_path", "engine_rebuilds", "live_switches", "pinned", "measuring", "measured", "live_switch_ms", "replicas")
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
    MEASURING_FIELD_NUMBER: _ClassVar[int]
    MEASURED_FIELD_NUMBER: _ClassVar[int]
    LIVE_SWITCH_MS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
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
    measuring: bool
    measured: _containers.RepeatedCompositeFieldContainer[MeasuredTPOT]
    live_switch_ms: _containers.RepeatedScalarFieldContainer[float]
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaControllerState]
    def __init__(self, enabled: _Optional[bool] = ..., active: _Optional[_Union[SpeculativeConfig, _Mapping]] = ..., candidates: _Optional[_Iterable[_Union[CandidateEstimate, _Mapping]]] = ..., decisions: _Optional[_Iterable[_Union[ControllerDecision, _Mapping]]] = ..., acceptance_per_position: _Optional[_Iterable[float]] = ..., running_requests: _Optional[float] = ..., profile_path: _Optional[str] = ..., engine_rebuilds: _Optional[int] = ..., live_switches: _Optional[int] = ..., pinned: _Optional[str] = ..., measuring: _Optional[bool] = ..., measured: _Optional[_Iterable[_Union[MeasuredTPOT, _Mapping]]] = ..., live_switch_ms: _Optional[_Iterable[float]] = ..., replicas: _Optional[_Iterable[_Union[ReplicaControllerState, _Mapping]]] = ...) -> None: ...

class ReplicaControllerState(_message.Message):
    __slots__ = ("replica_id", "state")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    state: ControllerState
    def __init__(self, replica_id: _Optional[str] = ..., state: _Optional[_Union[ControllerState, _Mapping]] = ...) -> None: ...

class MeasuredTPOT(_message.Message):
    __slots__ = ("load", "config", "tpot_ms", "windows", "age_s")
    LOAD_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    TPOT_MS_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    load: float
    config: str
    tpot_ms: float
    windows: int
    age_s: float
    def __init__(self, load: _Optional[float] = ..., config: _Optional[str] = ..., tpot_ms: _Optional[float] = ..., windows: _Optional[int] = ..., age_s: _Optional[float] = ...) -> None: ...

class Outcome(_message.Message):
    __slots__ = ("request_id", "kind", "shown_ms", "accepted_chars", "suggestion_chars", "acceptance", "rejection", "language_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SHOWN_MS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_CHARS_FIELD_NUMBER: _ClassVar[int]
    SUGGESTION_CHARS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_FIELD_NUMBER: _ClassVar[int]
    REJECTION_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    kind: OutcomeKind
    shown_ms: float
    accepted_chars: int
    suggestion_chars: int
    acceptance: Acceptance
    rejection: Rejection
    language_id: str
    def __init__(self, request_id: _Optional[str] = ..., kind: _Optional[_Union[OutcomeKind, str]] = ..., shown_ms: _Optional[float] = ..., accepted_chars: _Optional[int] = ..., suggestion_chars: _Optional[int] = ..., acceptance: _Optional[_Union[Acceptance, str]] = ..., rejection: _Optional[_Union[Rejection, str]] = ..., language_id: _Optional[str] = ...) -> None: ...

class ReportOutcomesRequest(_message.Message):
    __slots__ = ("outcomes", "request_id_prefix")
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_PREFIX_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[Outcome]
    request_id_prefix: str
    def __init__(self, outcomes: _Optional[_Iterable[_Union[Outcome, _Mapping]]] = ..., request_id_prefix: _Optional[str] = ...) -> None: ...

class ReportOutcomesResponse(_message.Message):
    __slots__ = ("recorded", "unknown_request_ids", "duplicates")
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    recorded: int
    unknown_request_ids: int
    duplicates: int
    def __init__(self, recorded: _Optional[int] = ..., unknown_request_ids: _Optional[int] = ..., duplicates: _Optional[int] = ...) -> None: ...

class GetOutcomeStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class OutcomeFigures(_message.Message):
    __slots__ = ("language", "latency_class", "speculative_config", "shown", "accepted", "partially_accepted", "rejected", "accepted_chars", "acceptance_rate", "accepted_chars_per_shown", "mean_shown_ms", "wasted_tokens_cancelled", "wasted_tokens_never_shown")
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    LATENCY_CLASS_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_CONFIG_FIELD_NUMBER: _ClassVar[int]
    SHOWN_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    PARTIALLY_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_CHARS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_RATE_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_CHARS_PER_SHOWN_FIELD_NUMBER: _ClassVar[int]
    MEAN_SHOWN_MS_FIELD_NUMBER: _ClassVar[int]
    WASTED_TOKENS_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    WASTED_TOKENS_NEVER_SHOWN_FIELD_NUMBER: _ClassVar[int]
    language: str
    latency_class: str
    speculative_config: str
    shown: int
    accepted: int
    partially_accepted: int
    rejected: int
    accepted_chars: int
    acceptance_rate: float
    accepted_chars_per_shown: float
    mean_shown_ms: float
    wasted_tokens_cancelled: int
    wasted_tokens_never_shown: int
    def __init__(self, language: _Optional[str] = ..., latency_class: _Optional[str] = ..., speculative_config: _Optional[str] = ..., shown: _Optional[int] = ..., accepted: _Optional[int] = ..., partially_accepted: _Optional[int] = ..., rejected: _Optional[int] = ..., accepted_chars: _Optional[int] = ..., acceptance_rate: _Optional[float] = ..., accepted_chars_per_shown: _Optional[float] = ..., mean_shown_ms: _Optional[float] = ..., wasted_tokens_cancelled: _Optional[int] = ..., wasted_tokens_never_shown: _Optional[int] = ...) -> None: ...

class OutcomeStats(_message.Message):
    __slots__ = ("total", "groups", "unknown_request_ids", "duplicates", "reporting_sessions", "never_shown_grace_s", "since_unix_time")
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    REPORTING_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NEVER_SHOWN_GRACE_S_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_TIME_FIELD_NUMBER: _ClassVar[int]
    total: OutcomeFigures
    groups: _containers.RepeatedCompositeFieldContainer[OutcomeFigures]
    unknown_request_ids: int
    duplicates: int
    reporting_sessions: int
    never_shown_grace_s: float
    since_unix_time: float
    def __init__(self, total: _Optional[_Union[OutcomeFigures, _Mapping]] = ..., groups: _Optional[_Iterable[_Union[OutcomeFigures, _Mapping]]] = ..., unknown_request_ids: _Optional[int] = ..., duplicates: _Optional[int] = ..., reporting_sessions: _Optional[int] = ..., never_shown_grace_s: _Optional[float] = ..., since_unix_time: _Optional[float] = ...) -> None: ...
