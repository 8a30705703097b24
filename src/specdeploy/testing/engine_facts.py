"""Facts read from the engines' real sources (vLLM sdists, SGLang wheels): the command-line flags, the
speculative-config keys and the speculative methods each release accepts.

The simulator checks a command line against these facts rather than against specdeploy's own flag table, so a
flag or a method the real engine would reject is rejected in the sandbox too. ``engines/facts.json`` holds the
facts of the releases the sandbox plays; ``tests/contract`` re-extracts them from the downloaded sources and
fails when they drift. Refresh: ``python -m specdeploy.testing.engine_facts record vllm 0.16.0`` (needs the index).
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


def record(engine: str, version: str) -> dict:
    from specdeploy.engines import upstream
    root = upstream.source(engine, version)
    data = json.loads(FACTS_FILE.read_text()) if FACTS_FILE.is_file() else {}
    data.setdefault(engine, {})[version] = extract(engine, root)
    FACTS_FILE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    _all.cache_clear()
    return data[engine][version]


if __name__ == "__main__":  # python -m specdeploy.testing.engine_facts record ENGINE VERSION...
    if len(sys.argv) < 4 or sys.argv[1] != "record":
        sys.exit("usage: python -m specdeploy.testing.engine_facts record ENGINE VERSION...")
    for v in sys.argv[3:]:
        f = record(sys.argv[2], v)
        print(f"{sys.argv[2]} {v}: {len(f['flags'])} flags, {len(f['spec_methods'])} speculative methods")
