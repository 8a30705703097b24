"""The engine registry: one adapter module per engine (``vllm.py``, ``sglang.py``) behind the interface in
``base.py``. Everything outside this package asks the registry for an engine's adapter instead of naming the
engine: ``get(name)`` gives the adapter class (facts that do not depend on the version), ``get_adapter(name,
version)`` an adapter for one pinned release, ``names()`` the engines the schema accepts.

A new engine is one module with an :class:`EngineAdapter` subclass, registered with :func:`register` (the
built-in ones are registered on first use).
"""
from __future__ import annotations

from specdeploy.engines.base import (
    AllReducePath,
    Command,
    CommContext,
    EngineAdapter,
    Health,
    Metrics,
    MiB,
    Pin,
    SimBehaviour,
    SimReject,
    Span,
    SpecMethod,
    UnsupportedVersion,
    dumps_compact,
    parse_version,
)

__all__ = ["AllReducePath", "Command", "CommContext", "EngineAdapter", "Health", "Metrics", "MiB", "Pin",
           "SimBehaviour", "SimReject", "Span", "SpecMethod", "UnsupportedVersion", "dumps_compact", "parse_version",
           "DEFAULT", "register",
           "unregister", "get", "get_adapter", "names", "adapters"]

# The engine a command uses when none is given (``sandbox up``, ``gate``).
DEFAULT = "vllm"

_REGISTRY: dict[str, type[EngineAdapter]] = {}
_BUILTINS_LOADED = False


def _builtins() -> dict[str, type[EngineAdapter]]:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        from specdeploy.engines.sglang import SGLang
        from specdeploy.engines.vllm import VLLM
        _BUILTINS_LOADED = True
        for cls in (VLLM, SGLang):
            _REGISTRY.setdefault(cls.name, cls)
    return _REGISTRY


def register(cls: type[EngineAdapter]) -> type[EngineAdapter]:
    """Add an adapter class under ``cls.name`` (usable as a class decorator)."""
    if not cls.name or not cls.name.isidentifier():
        raise ValueError(f"an engine adapter needs a name that is an identifier, not {cls.name!r}")
    have = _builtins().get(cls.name)
    if have is not None and have is not cls:
        raise ValueError(f"engine {cls.name!r} is registered already (by {have.__module__}.{have.__qualname__}); "
                         f"registered engines: {', '.join(names())}")
    _builtins()[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    _builtins().pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(_builtins())


def adapters() -> tuple[type[EngineAdapter], ...]:
    return tuple(_builtins().values())


def get(name: str) -> type[EngineAdapter]:
    cls = _builtins().get(name)
    if cls is None:
        raise UnsupportedVersion(f"unknown engine '{name}'; supported: {', '.join(names())}")
    return cls


def get_adapter(engine: str, version: str) -> EngineAdapter:
    return get(engine)(version)
