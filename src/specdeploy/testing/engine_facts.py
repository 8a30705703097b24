"""Facts read from the engines' real sources (vLLM sdists, SGLang wheels): the command-line flags, the
speculative-config keys and the speculative methods each release accepts.

The simulator checks a command line against these facts rather than against specdeploy's own flag table, so a
flag or a method the real engine would reject is rejected in the sandbox too. ``engines/facts.json`` holds the
facts of the releases the sandbox plays; ``tests/contract`` re-extracts them from the downloaded sources and
fails when they drift. Refresh: ``python -m specdeploy.testing.engine_facts record vllm 0.16.0`` (needs the
index), or from an installed release: ``... record vllm 0.32.0 --from VENV/lib/python3.11/site-packages``.
"""
from __future__ import annotations

import json
import sys
from functools import lru_cache
from pathlib import Path

FACTS_FILE = Path(__file__).resolve().parents[1] / "engines" / "facts.json"


def extract(engine: str, root: Path) -> dict:
    """Facts from an unpacked release (the directory that contains the engine's package)."""
    from specdeploy.engines import get
    return get(engine).facts_from_source(root)


@lru_cache(maxsize=None)
def _all() -> dict:
    return json.loads(FACTS_FILE.read_text()) if FACTS_FILE.is_file() else {}


def recorded(engine: str, version: str) -> dict | None:
    """The recorded facts of a release, or None when specdeploy has none for it."""
    d = _all().get(engine, {}).get(version)
    if d is None:
        return None
    return {k: frozenset(v) for k, v in d.items()}


def record(engine: str, version: str, root: Path | None = None) -> dict:
    """Extract and store the facts of a release: from its downloaded sources, or from ``root``, a directory that
    holds the release's package as installed (a wheel's site-packages carries the same Python sources)."""
    if root is None:
        from specdeploy.engines import upstream
        root = upstream.source(engine, version)
    data = json.loads(FACTS_FILE.read_text()) if FACTS_FILE.is_file() else {}
    data.setdefault(engine, {})[version] = extract(engine, root)
    FACTS_FILE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    _all.cache_clear()
    return data[engine][version]


if __name__ == "__main__":  # python -m specdeploy.testing.engine_facts record ENGINE VERSION... [--from DIR]
    args = sys.argv[1:]
    src = None
    if "--from" in args:
        i = args.index("--from")
        src = Path(args[i + 1]) if i + 1 < len(args) else None
        args = args[:i] + args[i + 2:]
    if len(args) < 3 or args[0] != "record" or ("--from" in sys.argv and src is None):
        sys.exit("usage: python -m specdeploy.testing.engine_facts record ENGINE VERSION... [--from SITE_PACKAGES]")
    for v in args[2:]:
        f = record(args[1], v, src)
        print(f"{sys.argv[2]} {v}: {len(f['flags'])} flags, {len(f['spec_methods'])} speculative methods")
