"""The MinT SDK: one set of verbs over two transports (mint.sdk.verbs over mint.sdk.transport).

- ``MintClient(settings, tenant)``: operators' direct transport, commands as Kafka events and
  answers as the events they caused, reads from Cassandra (mint.sdk.client).
- ``MintClient.remote(base_url, api_key)`` (``RemoteMintClient``): a tenant's HTTP transport,
  the gateway's routes with an API key alone (mint.sdk.remote; answers: mint.sdk.remote_types).

Shared, written once: promote (a canary with ``promote(..., canary=0.1)``), rollback,
canary_status, tag, retire, feedback, infer (vLLM's sampling and structured-output settings:
mint.sdk.sampling), policies, revisions, aliases, latest_revision. Direct only: create_policy,
train, rollout, update, evaluate (mint.sdk.training), wait_for, events, history, evaluations,
and the Tinker-style verbs on top (mint.sdk.tinker); HTTP only: configure (training over HTTP is
the gateway's Tinker API)."""

from mint.sdk.client import MintClient
from mint.sdk.exceptions import (
    CommandRefused,
    InvalidSampling,
    MintError,
    RequestFailed,
    WaitTimeout,
)
from mint.sdk.remote import RemoteError, RemoteMintClient
from mint.sdk.sampling import SamplingFields, sampling_options
from mint.sdk.tinker import (
    AdamParams,
    Datum,
    SamplingClient,
    SamplingParams,
    ServiceClient,
    TrainingClient,
)
from mint.sdk.training import Rollouts, Round, UpdateResult, rollouts_to_examples
from mint.sdk.watcher import Watcher, caused_by, correlated
from schemas.events.sampling import SamplingOptions, StructuredOutput

__all__ = [
    "AdamParams",
    "CommandRefused",
    "Datum",
    "InvalidSampling",
    "MintClient",
    "MintError",
    "RemoteError",
    "RemoteMintClient",
    "RequestFailed",
    "Rollouts",
    "Round",
    "SamplingClient",
    "SamplingFields",
    "SamplingOptions",
    "SamplingParams",
    "ServiceClient",
    "StructuredOutput",
    "TrainingClient",
    "UpdateResult",
    "WaitTimeout",
    "Watcher",
    "caused_by",
    "correlated",
    "rollouts_to_examples",
    "sampling_options",
]
