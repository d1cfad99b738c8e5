"""The MinT SDK: a client whose verbs are events (create_policy, train, rollout, update,
evaluate, promote (or start a canary: ``promote(..., canary=0.1)``), rollback, canary_status,
feedback, tag (a revision's labels), retire, infer, history, wait_for; vLLM's sampling and
structured-output settings on infer: mint.sdk.sampling) and Tinker-style verbs on top; a tenant's
client over HTTP with an API key alone: ``MintClient.remote(base_url, api_key)`` (mint.sdk.remote)."""

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
