"""One exception root: every error MinT raises on purpose is a ``MintError``, each layer's root
keeps the standard exception it replaces, and no exception is defined twice."""

from __future__ import annotations

import importlib
import inspect

import pytest

from schemas.exceptions import MintError

# Every module that defines exception classes (grep '^class .*Error' outside tests).
MODULES = [
    "schemas.exceptions",
    "catalog.exceptions",
    "catalog.cluster",
    "catalog.apikeys",
    "streams.exceptions",
    "streams.answered",
    "streams.records",
    "workers.evaluator.exceptions",
    "workers.models.exceptions",
    "workers.serving.exceptions",
    "workers.trainer.exceptions",
    "gateway.errors",
    "mint.dev.launcher",
    "mint.sdk.exceptions",
]
# Not errors: a signal the record loop raises to itself when its stop is set.
NOT_ERRORS = {"streams.records.Stopped"}


def defined_exceptions() -> list[type[BaseException]]:
    found = []
    for name in MODULES:
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            ours = cls.__module__ == name and f"{name}.{cls.__qualname__}" not in NOT_ERRORS
            if ours and issubclass(cls, BaseException):
                found.append(cls)
    return found


def test_every_error_is_a_mint_error() -> None:
    strays = [
        f"{c.__module__}.{c.__qualname__}"
        for c in defined_exceptions()
        if not issubclass(c, MintError)
    ]
    assert strays == [], f"inherit MintError (schemas/exceptions.py) in {strays}"


def test_no_exception_is_defined_twice() -> None:
    names = [c.__name__ for c in defined_exceptions()]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert twice == [], f"defined in more than one module: {twice}; keep one and import it"


@pytest.mark.parametrize(
    ("root", "standard"),
    [
        ("schemas.exceptions:SchemaError", ValueError),
        ("catalog.exceptions:CatalogUnavailable", ConnectionError),
        ("catalog.cluster:CassandraUnavailable", ConnectionError),
        ("streams.exceptions:KafkaUnavailable", ConnectionError),
        ("streams.exceptions:TopicError", ValueError),
        ("workers.trainer.exceptions:BadBatch", ValueError),
        ("workers.serving.exceptions:AdapterMissing", FileNotFoundError),
        ("workers.models.exceptions:ModelFetchError", RuntimeError),
        ("mint.dev.launcher:LauncherError", RuntimeError),
        ("mint.sdk.exceptions:WaitTimeout", TimeoutError),
    ],
)
def test_categories_keep_the_standard_exception_they_replace(root: str, standard: type) -> None:
    module, name = root.split(":")
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, MintError) and issubclass(cls, standard)


def test_the_sdk_root_is_the_one_root() -> None:
    from catalog.exceptions import CatalogError
    from mint.sdk import MintError as SdkRoot
    from streams import StreamsError

    assert SdkRoot is MintError
    assert issubclass(CatalogError, MintError) and issubclass(StreamsError, MintError)
