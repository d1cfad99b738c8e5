"""Errors in OpenAI's JSON shape: ``{"error": {"message", "type", "param", "code"}}``.

Each class fixes the HTTP status; the ``openai`` client turns them into its own exceptions
(400 BadRequestError, 401 AuthenticationError, 404 NotFoundError, 429 RateLimitError,
5xx InternalServerError). Messages say what was wrong and what to do, never what another tenant
owns.
"""

from __future__ import annotations

from typing import Any

from schemas.exceptions import MintError


class ApiError(MintError):
    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.param = message, param
        self.code = code or self.code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class BadRequest(ApiError):
    """400: the request is malformed, out of bounds, or asks for what is not supported."""

    status, type, code = 400, "invalid_request_error", "invalid_value"


class RequestTooLarge(BadRequest):
    """400: a body past the route's limit (read_body); a route may answer it otherwise."""

    code = "request_too_large"


class Unauthorized(ApiError):
    status, type, code = 401, "invalid_request_error", "invalid_api_key"

    def __init__(self, message: str = "") -> None:
        super().__init__(
            message
            or "Incorrect or revoked API key provided. Send "
            "'Authorization: Bearer mint_<key id>_<secret>' with a key from "
            "`mint keys create`."
        )


class ModelNotFound(ApiError):
    """404, the same for a missing model and for one of another tenant (no oracle)."""

    status, type, code = 404, "invalid_request_error", "model_not_found"

    def __init__(self, model: str) -> None:
        super().__init__(
            f"The model '{model[:300]}' does not exist or you do not have access "
            "to it. List yours with GET /v1/models.",
            param="model",
        )


class RateLimited(ApiError):
    status, type, code = 429, "requests", "rate_limit_exceeded"


class Unavailable(ApiError):
    """503 with Retry-After: no engine answered in time (or Kafka did not take the request)."""

    status, type, code = 503, "server_error", "engine_unavailable"


class EngineFailed(ApiError):
    status, type, code = 500, "server_error", "engine_error"
