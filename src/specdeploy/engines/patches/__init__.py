"""Engine patch sets: which patches a version needs, and a stable id for image tags and labels."""
from __future__ import annotations

import hashlib
from pathlib import Path

from specdeploy.engines import get_adapter


def required_patches(engine: str, version: str) -> tuple[str, ...]:
    """The patch ids the engine release needs (the adapter's patch hook); each engine's patches live in
    ``patches/<engine>.py``."""
    return get_adapter(engine, version).patch_ids()


def patch_set_id(engine: str, version: str, mode: str = "auto") -> str:
    """``none`` when nothing is applied, else a short hash of the patch ids and their source."""
    ids = required_patches(engine, version) if mode == "auto" else ()
    if not ids:
        return "none"
    h = hashlib.sha256()
    for i in ids:
        h.update(i.encode())
    src = Path(__file__).with_name(f"{engine}.py")
    if src.exists():
        h.update(src.read_bytes())
    return "p" + h.hexdigest()[:10]

