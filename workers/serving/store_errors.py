"""What a store or file error means for one adapter load.

The adapter store sorts its own failures (``AdapterStore.io``): a filesystem or endpoint that is
away is ``catalog.exceptions.StoreUnavailable``, a ConnectionError that the consumer loop waits
out; it passes through here unchanged (as does any ConnectionError or TimeoutError). Everything
else fails that load loudly, with its reason:

- not found, or another owner's files: AdapterMissing, with one text for both (no oracle about
  whether a digest exists under another tenant or policy);
- bytes that do not match, or fail verification: AdapterDigestMismatch;
- another base model: WrongBaseModel;
- any other OSError (permission denied, read-only file system, ...): StoreFailed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from catalog.exceptions import (
    AdapterCorrupted,
    AdapterNotFound,
    BaseModelMismatch,
    CatalogError,
    CrossTenantReference,
    InvalidReference,
)
from workers.serving.exceptions import (
    AdapterDigestMismatch,
    AdapterMissing,
    LoadError,
    StoreFailed,
    WrongBaseModel,
)

if TYPE_CHECKING:
    from catalog.models import Resolved

log = structlog.get_logger()


def _text(ref: Resolved) -> str:
    return f"{ref.tenant}/{ref.policy}@{ref.revision}"


def load_error(ref: Resolved, e: Exception) -> Exception:
    """The load error that a store or file error ``e`` of ``ref`` means (module docstring)."""
    if isinstance(e, LoadError | ConnectionError | TimeoutError):
        return e  # sorted already, or the store is away (transient: waited out)
    if isinstance(e, BaseModelMismatch):
        return WrongBaseModel(str(e))
    if isinstance(e, AdapterCorrupted):
        return AdapterDigestMismatch(str(e))
    if isinstance(e, AdapterNotFound | CrossTenantReference | InvalidReference | FileNotFoundError):
        # One answer for "not there" and "someone else's": no oracle across owners.
        log.warning(
            "adapter not available to its reference",
            ref=_text(ref),
            digest=ref.digest,
            detail=f"{type(e).__name__}: {e}"[:500],
        )
        return AdapterMissing(
            f"revision {_text(ref)} ({ref.digest}) is not in the store for {ref.tenant}/"
            f"{ref.policy} at {ref.store_uri}; check the reference against the catalog"
        )
    if isinstance(e, CatalogError):  # shape disagreements, NaN/Inf, unsafe format
        return AdapterDigestMismatch(f"revision {ref.digest} failed verification: {e}")
    if isinstance(e, OSError):
        return StoreFailed(
            f"reading revision {_text(ref)} ({ref.digest}) failed: {type(e).__name__}: {e}; "
            "check the store and the engine's cache folder (permissions, free space)"
        )
    return e
