"""Engine image names: the tag carries the engine version and the patch set."""
from __future__ import annotations

from .patches import patch_set_id

UPSTREAM_IMAGES = {"vllm": "vllm/vllm-openai", "sglang": "lmsysorg/sglang"}


def upstream_image(engine: str, version: str) -> str:
    tag = f"v{version}" if engine == "vllm" else f"v{version}"
    return f"{UPSTREAM_IMAGES[engine]}:{tag}"


def image_tag(engine: str, version: str, patches: str = "auto") -> str:
    return f"specdeploy/{engine}:{version}-{patch_set_id(engine, version, patches)}"
