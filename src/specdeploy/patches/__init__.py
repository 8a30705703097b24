"""Engine patch sets: which patches a version needs, and a stable id for image tags and labels."""
from __future__ import annotations

import hashlib
from pathlib import Path

from ..engines import get_adapter

# Patches for Kimi-K2.5 / DeepSeek EAGLE-3 on vLLM before 0.18.0 (see specdeploy.patches.vllm).
VLLM_KIMI_EAGLE3 = ("vllm-eagle3-target-whitelist", "vllm-kimi-image-token", "vllm-deepseek-supports-eagle3")


def required_patches(engine: str, version: str) -> tuple[str, ...]:
    adapter = get_adapter(engine, version)
    if engine == "vllm" and not adapter.has("kimi_eagle3_upstream"):
        return VLLM_KIMI_EAGLE3
    return ()


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

