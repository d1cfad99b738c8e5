"""The adapter store: immutable, content-addressed revision directories on a filesystem.

Layout: ``<root>/<tenant>/<policy>/adapters/<digest hex>/`` holding ``adapter_config.json``,
``adapter_model.safetensors``, ``manifest.json`` and, for MoE adapters,
``adapter_packed.safetensors`` (written by ``put``; see ``catalog/packed.py``). A revision is
written into ``<root>/.tmp/<random>/`` and renamed into place, so a reader sees all of it or none
of it, and two writers of the same bytes end with one directory. Every read recomputes the digest.

Here the root is a local path (``MINT_STORE_URI``, default ``.mint/store``). The scale-out path
is an S3-compatible bucket through fsspec (``s3://bucket/prefix``): the same layout, with the
atomic rename replaced by "upload under a temporary key, then write ``manifest.json`` last",
and readers treating a directory without a valid manifest as absent.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from catalog.artifacts import (
    ADAPTER_FILES,
    LAYOUT_PACKED_MOE,
    LAYOUT_PEFT,
    MANIFEST_FILE,
    PACKED_FILE,
    Manifest,
    adapter_digest,
    check_manifest_matches,
    file_sha256,
    inspect_adapter,
    read_manifest,
)
from catalog.exceptions import (
    AdapterCorrupted,
    AdapterNotFound,
    BaseModelMismatch,
    CatalogError,
    CrossTenantReference,
    InvalidReference,
    StoreUnavailable,
)

log = structlog.get_logger()

# OSErrors that say the store's filesystem or endpoint is away, not that a path or a file is
# wrong: an NFS/FUSE mount that is hung, stale or disconnected, a network path that does not
# answer, a disk that is full. Transient (StoreUnavailable): waited out, never a dead letter.
# Anything else (EACCES, EROFS, ENOENT of a file, ...) stays an OSError and fails loudly.
# fmt: off
_UNREACHABLE = ("EIO", "ENOTCONN", "ESTALE", "ETIMEDOUT", "EHOSTDOWN", "EHOSTUNREACH", "ENETDOWN",
                "ENETUNREACH", "ECONNREFUSED", "ECONNRESET", "ECONNABORTED", "ENOSPC", "EDQUOT",
                "ENOMEDIUM", "ECOMM")
# fmt: on
# ENOMEDIUM and ECOMM are Linux's: not every platform names every one.
UNREACHABLE_ERRNOS = frozenset(getattr(errno, n) for n in _UNREACHABLE if hasattr(errno, n))


@dataclass(frozen=True)
class StoredAdapter:
    """A verified revision directory in the store."""

    digest: str
    uri: str
    path: Path
    manifest: Manifest

    @property
    def size_bytes(self) -> int:
        return self.manifest.size_bytes


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _io(doing: str) -> Callable:
    """Run an AdapterStore method under ``self.io(doing)``."""

    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        def run(self: AdapterStore, *args: Any, **kwargs: Any) -> Any:
            with self.io(doing):
                return method(self, *args, **kwargs)

        return run

    return wrap


class AdapterStore:
    """Put and open adapter revisions under one root folder."""

    def __init__(self, root: Path | str) -> None:
        root = str(root)
        if root.startswith("s3://"):
            raise InvalidReference(
                f"store root {root!r}: S3 stores are the documented scale-out path (fsspec) and "
                "are not wired up yet; use a local folder (MINT_STORE_URI=/path)"
            )
        self.root = Path(root.removeprefix("file://")).resolve()
        # A root that was there and is gone is a filesystem that went away (unmounted); a root
        # that never was is an empty store (nothing in it yet: AdapterNotFound).
        self._root_seen = self._root_reachable()

    @classmethod
    def from_settings(cls, settings: Any) -> AdapterStore:
        return cls(settings.adapter_store_root)

    @contextmanager
    def io(self, doing: str) -> Iterator[None]:
        """Sort the store's failures while ``doing``: a filesystem or endpoint that is away
        (UNREACHABLE_ERRNOS, or a root that was there gone: unmounted) becomes StoreUnavailable,
        which consumer loops wait out; what is wrong with one revision or path stays what it is
        (AdapterNotFound, AdapterCorrupted, PermissionError...). Callers that copy from the
        store themselves (an engine's cache) use it too: ``with store.io("copy revision"):``."""
        try:
            yield
            self._root_seen = self._root_seen or self._root_reachable()
        except StoreUnavailable:
            raise
        except AdapterNotFound as e:  # a missing manifest under a root that went away
            if self._root_gone():
                raise StoreUnavailable(
                    f"the adapter store root {str(self.root)!r} is not there to {doing} ({e}); "
                    "check that its filesystem is mounted (MINT_STORE_URI): the worker "
                    "retries until it is"
                ) from e
            raise
        except CatalogError:  # a verdict on a revision or a path, already sorted
            raise
        except OSError as e:
            if e.errno in UNREACHABLE_ERRNOS or self._root_gone():
                raise StoreUnavailable(
                    f"the adapter store at {str(self.root)!r} is not reachable to {doing} "
                    f"({type(e).__name__}: {e}); check that its filesystem is mounted and "
                    "answers (MINT_STORE_URI): the worker retries until it does"
                ) from e
            raise

    def _root_reachable(self) -> bool:
        try:
            return self.root.is_dir()
        except OSError:
            return False

    def _root_gone(self) -> bool:
        return self._root_seen and not self._root_reachable()

    # Paths and URIs.

    def path_for(self, tenant: str, policy: str, digest: str) -> Path:
        return self.root / tenant / policy / "adapters" / digest.removeprefix("sha256:")

    def uri_for(self, tenant: str, policy: str, digest: str) -> str:
        return self.path_for(tenant, policy, digest).as_uri()

    def path_of_uri(self, uri: str, owner: tuple[str, str] | None = None) -> Path:
        """The path of ``uri`` under the root; with ``owner`` (tenant, policy), it must lie in
        that policy's folder (compared as path components after normalization)."""
        if not uri.startswith("file://"):
            raise InvalidReference(f"store URI {uri!r}: this store reads file:// URIs only")
        path = Path(uri.removeprefix("file://")).resolve()
        if self.root not in path.parents:
            raise InvalidReference(
                f"store URI {uri!r} lies outside this store's root {str(self.root)!r}"
            )
        if owner is not None and path.relative_to(self.root).parts[:2] != tuple(owner):
            raise CrossTenantReference(
                f"store URI {uri!r} lies outside {owner[0]}/{owner[1]}'s folder "
                f"{str(self.root / owner[0] / owner[1])!r}: a revision is read only from its "
                "own policy's namespace"
            )
        return path

    # Writing.

    @_io("store a revision")
    def put(
        self,
        source: Path | str,
        *,
        tenant: str,
        policy: str,
        base_model: str,
        base_model_fingerprint: str,
        parent: StoredAdapter | None = None,
        parent_revision: int | None = None,
        training: dict[str, Any] | None = None,
    ) -> StoredAdapter:
        """Check the PEFT directory ``source`` and store it as an immutable revision.

        Idempotent: the same adapter bytes give the same digest and the existing directory.
        Refuses (``AdapterRejected`` subclasses) pickle weights, NaN/Inf, shape/target
        disagreements, and a ``parent`` trained on another base model.
        """
        source = Path(source)
        shape = inspect_adapter(source)
        if parent is not None and parent.manifest.base_model_fingerprint != base_model_fingerprint:
            raise BaseModelMismatch(
                f"base_model_fingerprint={base_model_fingerprint} differs from the parent "
                f"revision's {parent.manifest.base_model_fingerprint} ({parent.uri}); a policy "
                "keeps one base model — start a new policy for another base"
            )
        source_hashes = {name: file_sha256(source / name) for name in ADAPTER_FILES}
        tmp = self.root / ".tmp" / uuid.uuid4().hex
        tmp.mkdir(parents=True)
        try:
            for name in ADAPTER_FILES:
                shutil.copyfile(source / name, tmp / name)
            # A MoE adapter gets its packed file, made here from the copied PEFT files (a packed
            # file in ``source`` is never taken as is); the digest covers it.
            from catalog.packed import write_packed  # torch: only where adapters are written

            layout = write_packed(tmp)
            digest, hashes = adapter_digest(tmp)
            # The copy must still hash as the source did (a source changed mid-copy is caught).
            if any(hashes[name] != source_hashes[name] for name in ADAPTER_FILES):
                raise AdapterCorrupted(f"{source} changed while it was being stored; retry")
            final = self.path_for(tenant, policy, digest)
            if final.exists():
                shutil.rmtree(tmp, ignore_errors=True)
                log.info("adapter_exists", digest=digest, path=str(final))
                return self.open_path(final, base_model_fingerprint=base_model_fingerprint)
            manifest = Manifest(
                digest=digest,
                files=hashes,
                size_bytes=sum((tmp / n).stat().st_size for n in hashes),
                layout=layout,
                tenant=tenant,
                policy=policy,
                base_model=base_model,
                base_model_fingerprint=base_model_fingerprint,
                rank=shape.rank,
                lora_alpha=shape.lora_alpha,
                target_modules=shape.target_modules,
                target_parameters=shape.target_parameters,
                parent_revision=parent_revision,
                parent_digest=parent.digest if parent is not None else None,
                training=training or {},
            )
            (tmp / MANIFEST_FILE).write_text(manifest.model_dump_json(indent=2) + "\n")
            for name in (*hashes, MANIFEST_FILE):
                with (tmp / name).open("rb+") as f:
                    os.fsync(f.fileno())
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(tmp, final)
            except OSError:
                if not final.exists():
                    raise
                # Another writer stored the same bytes first: theirs is as good as ours.
                shutil.rmtree(tmp, ignore_errors=True)
            _fsync_dir(final.parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("adapter_stored", digest=digest, uri=final.as_uri(), tenant=tenant, policy=policy)
        return self.open_path(final, base_model_fingerprint=base_model_fingerprint)

    # Reading.

    def open(
        self,
        uri: str,
        *,
        owner: tuple[str, str] | None = None,
        base_model_fingerprint: str | None = None,
    ) -> StoredAdapter:
        """Open and verify the revision at ``uri`` (digest, shape, finiteness, base model). With
        ``owner`` (tenant, policy) the URI and the manifest must both belong to that policy."""
        return self.open_path(
            self.path_of_uri(uri, owner), owner=owner, base_model_fingerprint=base_model_fingerprint
        )

    def get(
        self, tenant: str, policy: str, digest: str, *, base_model_fingerprint: str | None = None
    ) -> StoredAdapter:
        return self.open_path(
            self.path_for(tenant, policy, digest), base_model_fingerprint=base_model_fingerprint
        )

    @_io("open a revision")
    def open_path(
        self,
        path: Path,
        *,
        owner: tuple[str, str] | None = None,
        base_model_fingerprint: str | None = None,
    ) -> StoredAdapter:
        if not (path / MANIFEST_FILE).is_file():
            raise AdapterNotFound(
                f"no stored revision at {str(path)!r} (no {MANIFEST_FILE}); check the URI or "
                "digest against the catalog"
            )
        manifest = read_manifest(path)
        shape = inspect_adapter(path)
        digest, hashes = adapter_digest(path)
        if digest != manifest.digest or path.name != digest.removeprefix("sha256:"):
            raise AdapterCorrupted(
                f"revision at {str(path)!r}: content digest is {digest} but the manifest says "
                f"{manifest.digest} (folder {path.name}); the files were modified — restore "
                "them from a replica or re-export the revision"
            )
        check_manifest_matches(manifest, shape)
        layout = LAYOUT_PACKED_MOE if PACKED_FILE in hashes else LAYOUT_PEFT
        if manifest.layout != layout or set(manifest.files) != set(hashes):
            raise AdapterCorrupted(
                f"revision at {str(path)!r}: the manifest says layout {manifest.layout!r} with "
                f"files {sorted(manifest.files)}, the folder holds {sorted(hashes)}; restore it "
                "from a replica or re-export the revision"
            )
        if owner is not None and (manifest.tenant, manifest.policy) != tuple(owner):
            raise CrossTenantReference(
                f"revision at {str(path)!r} belongs to {manifest.tenant}/{manifest.policy} by "
                f"its manifest, not to {owner[0]}/{owner[1]}: it is not loaded for another policy"
            )
        if base_model_fingerprint is not None and (
            manifest.base_model_fingerprint != base_model_fingerprint
        ):
            raise BaseModelMismatch(
                f"revision {manifest.digest} was trained on base model "
                f"{manifest.base_model!r} with fingerprint {manifest.base_model_fingerprint}, "
                f"but this engine's base has fingerprint {base_model_fingerprint}; load it on "
                "an engine with that base model"
            )
        return StoredAdapter(digest=digest, uri=path.as_uri(), path=path, manifest=manifest)

    # Request records: which revision an update request produced (the trainer's idempotency).

    def _request_path(self, tenant: str, policy: str, request_id: str) -> Path:
        if not request_id.replace("-", "").isalnum():
            raise InvalidReference(f"request id {request_id!r} must be a UUID or alphanumeric")
        return self.root / tenant / policy / "requests" / f"{request_id}.json"

    @_io("record a request")
    def record_request(self, tenant: str, policy: str, request_id: str, result: dict) -> None:
        """Write (atomically, once) what request ``request_id`` produced; first writer wins."""
        path = self._request_path(tenant, policy, request_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        tmp.write_text(json.dumps(result, sort_keys=True, default=str))
        with tmp.open("rb+") as f:
            os.fsync(f.fileno())
        if path.exists():
            tmp.unlink()
            return
        os.rename(tmp, path)

    @_io("find a request")
    def find_request(self, tenant: str, policy: str, request_id: str) -> dict | None:
        path = self._request_path(tenant, policy, request_id)
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None

    @_io("list revisions")
    def list(self, tenant: str, policy: str) -> list[str]:
        """Digests stored for one policy (unverified: open one to verify it)."""
        folder = self.root / tenant / policy / "adapters"
        if not folder.is_dir():
            return []
        return sorted("sha256:" + p.name for p in folder.iterdir() if (p / MANIFEST_FILE).exists())
