"""The one error type of a refused or failed request, shared by the service
and both front ends."""

from __future__ import annotations


class RequestError(Exception):
    """A request the server refuses, or one that failed.

    ``code`` is a gRPC status name (each front end maps it to its own status).
    ``field`` is the CompleteRequest field at fault, ``at`` the element within
    it ("[2]" of ``stop``), None for refusals that are about no one field
    (limits, engine state, server errors). The field is kept apart from the
    text so that each front end names it its own way: gRPC as the proto field,
    HTTP as the OpenAI parameter it came from. ``metadata`` goes out as gRPC
    trailing metadata (machine-readable details).
    """

    def __init__(self, code: str, detail: str, metadata: dict[str, str] | None = None, *, field: str | None = None, at: str = ""):
        self.code = code
        self.detail = detail
        self.field = field
        self.at = at
        self.metadata = metadata or {}
        super().__init__(self.message)

    def naming(self, name: str | None) -> str:
        """The message with the field called ``name``."""
        return self.detail if self.field is None else f"{name}{self.at}: {self.detail}"

    @property
    def message(self) -> str:
        """The message with the field named as in the CompleteRequest (what gRPC sends)."""
        return self.naming(self.field)


def invalid(field: str | None, detail: str, at: str = "") -> RequestError:
    """An INVALID_ARGUMENT refusal about ``field`` (None: the request as a whole)."""
    return RequestError("INVALID_ARGUMENT", detail, field=field, at=at)
