"""Dead letters. A dead-lettered record keeps its original key and value bytes untouched (so that
``mint replay`` can re-drive it once fixed); the Kafka headers below say why and from where."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field

# "refused": the handler refused the record by rule (streams.exceptions.is_refusal), at once;
# "handler_failed": an unknown error outlasted the retries.
Reason = Literal[
    "undecodable", "invalid", "unknown_type", "unknown_version", "refused", "handler_failed"
]
HEADER_PREFIX = "mint.dlq."


class DeadLetter(BaseModel):
    """What the dead-letter headers carry (``mint.dlq.<field>``, UTF-8 values)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    reason: Reason
    error: str = Field(max_length=4096, description="the exception, one line")
    topic: str = Field(min_length=1, description="original topic")
    partition: int = Field(ge=0, description="original partition")
    offset: int = Field(ge=0, description="original offset")
    group: str = Field(description="consumer group that gave up")
    attempts: int = Field(1, ge=1, description="handler attempts before giving up")
    event_type: str | None = Field(None, description="envelope type, when it was readable")
    event_id: str | None = Field(None, description="envelope event_id, when it was readable")

    def to_headers(self) -> list[tuple[str, bytes]]:
        return [
            (HEADER_PREFIX + k, str(v).encode())
            for k, v in self.model_dump().items()
            if v is not None
        ]

    @classmethod
    def from_headers(cls, headers: list[tuple[str, bytes]]) -> Self:
        fields = {
            k.removeprefix(HEADER_PREFIX): v.decode("utf-8", "replace")
            for k, v in headers
            if k.startswith(HEADER_PREFIX)
        }
        return cls.model_validate(fields)
