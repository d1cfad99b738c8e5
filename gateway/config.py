"""The gateway's configuration: validated when built (``mint gateway`` flags fill it)."""

from __future__ import annotations

import os
import secrets
import socket

from pydantic import BaseModel, ConfigDict, Field, model_validator

INSTANCE_ID_RE = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,47}$"


def default_instance_id() -> str:
    """Host name (a pod's name on Kubernetes) plus a random suffix: unique per process, so a
    restarted instance never takes the answers meant for its predecessor."""
    host = "".join(c if c.isalnum() or c in "_-" else "-" for c in socket.gethostname())[:24]
    return f"gw-{host.strip('-') or 'host'}-{os.getpid()}-{secrets.token_hex(3)}"


class GatewayConfig(BaseModel):
    """One gateway instance. Limits bound what a client can make the engines do."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535, description="0: any free port (tests)")
    instance_id: str = Field(default_factory=default_instance_id, pattern=INSTANCE_ID_RE)
    # Waiting for engines.
    answer_timeout_s: float = Field(60.0, gt=0, description="no answer by then: 503")
    retry_after_s: int = Field(5, ge=1, description="Retry-After of a 503")
    # Caches (per instance; nothing another instance needs lives here).
    key_ttl_s: float = Field(5.0, gt=0, description="a revoked key stops working within this")
    catalog_ttl_s: float = Field(5.0, gt=0, description="policies and tenants' rates")
    # Per-tenant token bucket, per instance, when the tenant's access row sets no rate.
    rate_per_s: float = Field(20.0, gt=0, description="default requests per second per tenant")
    burst: int = Field(40, ge=1, description="default bucket size per tenant")
    # Failed API key checks (each costs a catalog read and a scrypt run): past the budget, 429.
    key_failures_burst: int = Field(10, ge=1, description="failed checks per key id at once")
    key_failures_per_s: float = Field(0.2, gt=0, description="then this many per second")
    client_failures_burst: int = Field(20, ge=1, description="failed checks per address at once")
    client_failures_per_s: float = Field(1.0, gt=0, description="then this many per second")
    key_check_threads: int = Field(2, ge=1, le=16, description="threads that run scrypt")
    # Bounds on a request.
    max_body_bytes: int = Field(256 * 1024, ge=1024)
    max_prompt_chars: int = Field(32_000, ge=1, le=200_000)
    max_messages: int = Field(256, ge=1, le=256)
    max_tokens: int = Field(4096, ge=1, le=32768, description="largest max_tokens accepted")
    default_max_tokens: int = Field(256, ge=1, description="chat max_tokens when not given")
    max_choices: int = Field(8, ge=1, le=64, description="n × prompts per request")
    # vllm serve's options of the same names (gateway.tools, gateway.tokenize)
    tool_call_parser: str | None = Field(None, description="tool calls in answers: hermes")
    enable_auto_tool_choice: bool = Field(False, description="tools: with tool_call_parser")
    max_model_len: int | None = Field(
        None, ge=1, description="/tokenize's max_model_len (None: the model's config)"
    )

    @model_validator(mode="after")
    def _tool_options(self) -> GatewayConfig:
        from gateway.tools import ToolOptions  # vllm serve's rules for the two options

        ToolOptions(self.tool_call_parser, self.enable_auto_tool_choice)
        return self
