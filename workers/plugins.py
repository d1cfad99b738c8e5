"""Rewards and evaluation suites from outside MinT: one lookup for both registries.

A name is looked up in this order:

1. the built-ins (``register`` in workers.serving.rewards, ``register_suite`` in
   workers.evaluator.suites);
2. the Python entry points of the registry's group (``mint.rewards``, ``mint.suites``), which
   any installed distribution may declare in its ``pyproject.toml``::

       [project.entry-points."mint.rewards"]
       exact_answer = "acme_tasks.rewards:exact_answer"

3. a ``module:attribute`` reference (``acme_tasks.rewards:exact_answer``), imported directly,
   but only when the module is under one of the operator's ``MINT_PLUGIN_MODULES`` prefixes:
   the name arrives in an event, and importing a module runs its code, so whoever may publish
   the event would otherwise choose what code the worker runs.

What was found is checked (``check``: a reward is a callable taking ``(prompt, completion,
token_ids)``, a suite is a ``Suite``) and cached for the life of the process. The group's entry
points are read once too, at the first name that is not a built-in: a plugin installed later is
seen after a restart of the worker, and a request naming an unknown plugin costs a dict lookup,
not a scan of every installed distribution.

Anything that goes wrong on the way (not found, import error, wrong type, module not allowed)
raises the registry's ``error`` (UnknownReward, UnknownSuite) naming the plugin and what was
expected, so a broken plugin fails its request the way an unknown name does and never the
worker. That error is also a ``streams.exceptions.Refused``: the same request would fail the
same way until the operator installs or fixes the plugin and restarts the worker, so the
consumer loop dead-letters it at once (reason ``refused``) instead of retrying it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib import import_module
from importlib.metadata import EntryPoint, entry_points
from typing import Generic, TypeVar

import structlog

from schemas.names import PLUGIN_REF_RE
from schemas.settings import get_settings
from streams.exceptions import Refused

log = structlog.get_logger()

T = TypeVar("T")

_REF = re.compile(PLUGIN_REF_RE)


class Registry(Generic[T]):
    """Built-ins by name, then the ``group`` entry points, then allowed ``module:attr``."""

    def __init__(
        self,
        kind: str,
        group: str,
        builtins: dict[str, T],
        check: Callable[[object], T],
        error: type[Exception],
        how_to_register: str,
    ) -> None:
        """``check(obj)`` returns the plugin (a suite factory is called there) or raises an
        error saying what was expected; ``how_to_register`` ends the message for an unknown
        name."""
        self.kind, self.group, self.builtins = kind, group, builtins
        self.check, self.how_to_register = check, how_to_register
        self.error = refusal_of(error)
        self._loaded: dict[str, T] = {}
        self._entry_points: dict[str, list[EntryPoint]] | None = None  # read once (forget())

    def forget(self) -> None:
        """Drop what was loaded and the entry points read, so the next lookup reads them again
        (tests that install a distribution; a worker restarts instead)."""
        self._loaded, self._entry_points = {}, None

    def get(self, name: str, *, allowed_modules: tuple[str, ...] | None = None) -> T:
        """The plugin called ``name``. ``allowed_modules``: the module prefixes a ``module:attr``
        may import from (None: the ``MINT_PLUGIN_MODULES`` setting)."""
        if name in self.builtins:
            return self.builtins[name]
        if _REF.match(name):
            self._allow(name, allowed_modules)
        if name not in self._loaded:
            self._loaded[name] = self._load(name)
        return self._loaded[name]

    def _load(self, name: str) -> T:
        if _REF.match(name):
            module, _, attr = name.partition(":")
            where = f"{self.kind} {name!r}"
            obj = self._guarded(where, lambda: getattr(import_module(module), attr))
            return self._checked(where, obj)
        found = self._declared().get(name, [])
        if not found:
            raise self.error(
                f"{self.kind} {name!r} is not registered; known: {sorted(self.builtins)}; "
                f"entry points ({self.group}): {sorted(self._declared())}; "
                f"{self.how_to_register} (entry points are read once per worker process: "
                "restart the worker after installing a plugin)"
            )
        if len({ep.value for ep in found}) > 1:
            raise self.error(
                f"{self.kind} {name!r} is declared by several {self.group!r} entry points ("
                + ", ".join(_describe(ep) for ep in found)
                + "): uninstall or rename all but one"
            )
        where = f"{self.kind} {name!r} (entry point {_describe(found[0])})"
        obj = self._checked(where, self._guarded(where, found[0].load))
        log.info("plugin loaded", kind=self.kind, name=name, entry_point=found[0].value)
        return obj

    def _guarded(self, where: str, load: Callable[[], object]) -> object:
        # A plugin's import runs someone else's code: whatever it raises (SystemExit included)
        # fails this one request, not the worker.
        try:
            return load()
        except (Exception, SystemExit) as e:
            raise self.error(
                f"{where} could not be loaded: {type(e).__name__}: {e}; fix or reinstall the "
                "plugin and restart the worker"
            ) from e

    def _checked(self, where: str, obj: object) -> T:
        try:
            return self.check(obj)  # a suite factory runs plugin code here too
        except (Exception, SystemExit) as e:
            raise self.error(f"{where} is not a usable {self.kind}: {e}") from e

    def _allow(self, name: str, allowed: tuple[str, ...] | None) -> None:
        allowed = get_settings().plugin_modules if allowed is None else allowed
        module = name.partition(":")[0].split(".")
        if any(module[: len(p.split("."))] == p.split(".") for p in allowed):
            return
        raise self.error(
            f"{self.kind} {name!r} imports module {'.'.join(module)!r}, which is not under the "
            f"allowed plugin modules {list(allowed)}: a module named in an event runs its code, "
            "so the operator must allow it by setting MINT_PLUGIN_MODULES (comma-separated "
            f"module prefixes, e.g. {module[0]}) on the workers, or install it as a "
            f"{self.group!r} entry point and use its name"
        )

    def _declared(self) -> dict[str, list[EntryPoint]]:
        """The group's entry points by name, read on first use and kept."""
        if self._entry_points is None:
            declared: dict[str, list[EntryPoint]] = {}
            for ep in entry_points(group=self.group):
                declared.setdefault(ep.name, []).append(ep)
            self._entry_points = declared
        return self._entry_points


def refusal_of(error: type[Exception]) -> type[Exception]:
    """``error`` that is also a ``Refused`` (so ``except UnknownReward`` still catches it, and
    the consumer loop dead-letters its request at once, without retries). Its message is shown
    as given: ``UnknownReward`` is a ``KeyError``, whose own ``str`` would quote it."""
    if issubclass(error, Refused):
        return error
    return type(
        error.__name__,
        (error, Refused),
        {
            "__str__": BaseException.__str__,
            "__module__": error.__module__,
            "__doc__": error.__doc__,
        },
    )


def _describe(ep: EntryPoint) -> str:
    dist = ep.dist.name if ep.dist is not None else "unknown distribution"
    return f"{ep.name} = {ep.value!r} of {dist}"
