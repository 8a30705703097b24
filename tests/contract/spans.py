"""The releases a contract test must read: the first and the last release inside every span an adapter's tables
claim (capabilities, flags, speculative-config keys, load formats, drafter rules, all-reduce tables), ordered as
versions (PEP 440), not as strings."""
from __future__ import annotations

import importlib

from packaging.version import Version

from specdeploy.engines import Span, get


def _spans(x, out: list[Span]) -> list[Span]:
    if isinstance(x, Span):
        out.append(x)
    elif isinstance(x, dict):
        for v in x.values():
            _spans(v, out)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _spans(v, out)
    return out


def claimed_spans(engine: str) -> list[Span]:
    """Every Span in the adapter module's tables (its upper-case module attributes) and class tables."""
    cls = get(engine)
    mod = importlib.import_module(cls.__module__)
    out: list[Span] = []
    for name in dir(mod):
        if name.isupper():
            _spans(getattr(mod, name), out)
    for table in (cls.capabilities, cls.flags, cls.load_formats, cls.DRAFTER, cls.metrics.spans):
        _spans(table, out)
    return out


def endpoints(engine: str, spans: list[Span] | None = None) -> list[str]:
    """The first and last supported release inside each span, sorted as versions."""
    versions = sorted(get(engine).versions, key=Version)
    out: set[str] = set()
    for span in claimed_spans(engine) if spans is None else spans:
        inside = [v for v in versions if in_span(v, span)]
        if inside:
            out |= {inside[0], inside[-1]}
    return sorted(out, key=Version)


def in_span(version: str, span: Span) -> bool:
    """Span membership by PEP 440 ordering (the reference the adapters' own comparison is tested against)."""
    v = Version(version)
    return (span.since is None or v >= Version(span.since)) and (span.until is None or v < Version(span.until))
