"""The lines of an import file (``mint catalog import``): one ``ImportRow`` each, the reason a
bad one is rejected, and the record the rejects file keeps of it (catalog/importer.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from schemas.names import AliasName, Digest, PolicyName, StoreUri, TenantName, in_namespace

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_RAW_KEPT = 4096  # characters of a rejected line kept in the rejects file


class ImportRow(BaseModel):
    """One line of an import file: one revision of one policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant: TenantName
    policy: PolicyName
    revision: int = Field(ge=1, le=2**31 - 1, strict=True)
    digest: Digest
    uri: StoreUri
    base_model: str = Field(min_length=1, max_length=512)
    created_at: datetime | None = None
    rank: int | None = Field(None, ge=1, le=1024, strict=True)
    aliases: list[AliasName] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _row_checks(self) -> ImportRow:
        if not in_namespace(self.uri, self.tenant, self.policy):
            raise ValueError(
                f"uri {self.uri!r} lies outside {self.tenant}/{self.policy}: its path must "
                f"contain '/{self.tenant}/{self.policy}/' (serving opens it as that policy's)"
            )
        if len(set(self.aliases)) != len(self.aliases):
            raise ValueError(f"aliases {self.aliases} name an alias twice")
        return self


_EXPECTED = {
    "tenant": "1-63 of [a-z0-9-] starting with a letter or digit",
    "policy": "1-127 of [a-z0-9._-] starting with a letter or digit",
    "digest": "'sha256:' and 64 lowercase hex digits",
    "aliases": "1-32 of [a-z0-9-] starting with a letter, e.g. 'prod'",
}


def row_error(e: ValidationError) -> str:
    """One readable reason per wrong field: the field, what is wrong, what was given, and for the
    name and digest rules what is expected."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        field_name = str(err["loc"][0]) if err["loc"] else ""
        if err["type"] == "json_invalid":
            parts.append(f"not a JSON object: {err['msg']}")
            continue
        msg = err["msg"].removeprefix("Value error, ")
        if not loc and err["type"] == "value_error":
            parts.append(msg)  # the row's own checks: the message starts with the field
            continue
        if err["type"] == "string_pattern_mismatch" and field_name in _EXPECTED:
            msg = f"not valid: expected {_EXPECTED[field_name]}"
        given = err.get("input")
        shown = "" if isinstance(given, dict) or not loc else f" (got {given!r:.120})"
        parts.append(f"{loc or 'row'}: {msg}{shown}")
    return "; ".join(parts)


def parse_row(line: bytes | str) -> ImportRow:
    """Validate one line; raises ValueError with ``row_error``'s reason."""
    try:
        return ImportRow.model_validate_json(line)
    except ValidationError as e:
        raise ValueError(row_error(e)) from None


def epoch_ms(at: datetime) -> int:
    at = at.replace(tzinfo=UTC) if at.tzinfo is None else at
    return (at - _EPOCH) // _MS


def reject_record(n: int, reason: str, raw: bytes) -> bytes:
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    rec = {"line": n, "reason": reason, "raw": text[:_RAW_KEPT]}
    if len(text) > _RAW_KEPT:
        rec["raw_truncated"] = True
    return (json.dumps(rec, ensure_ascii=False) + "\n").encode()
