"""Engine images: names (the tag carries the engine version and the patch set) and how to build them.

Production builds ``docker/<engine>.Dockerfile`` FROM the official engine image. A sandbox host cannot reach
Docker Hub, so it builds the same Dockerfile FROM a local stand-in: the sandbox rootfs loaded into Docker plus
the engine's real Python sources (``docker/sandbox-engine.Dockerfile``), whose entry points run the simulator.
"""
from __future__ import annotations

from .patches import patch_set_id, required_patches

UPSTREAM_IMAGES = {"vllm": "vllm/vllm-openai", "sglang": "lmsysorg/sglang"}
VERSION_ARGS = {"vllm": "VLLM_VERSION", "sglang": "SGLANG_VERSION"}


def upstream_image(engine: str, version: str) -> str:
    return f"{UPSTREAM_IMAGES[engine]}:v{version}"


def image_tag(engine: str, version: str, patches: str = "auto") -> str:
    return f"specdeploy/{engine}:{version}-{patch_set_id(engine, version, patches)}"


def standin_image(engine: str, version: str) -> str:
    """The sandbox's local stand-in for the official engine image."""
    return f"specdeploy-sandbox/{UPSTREAM_IMAGES[engine].split('/')[1]}:v{version}"


def build_plan(engine: str, version: str, patches: str = "auto", sandbox: bool = False,
               tag: str | None = None, source: str = "unknown") -> dict:
    """Everything the engine_image role needs to build a host's engine image (``source`` is the wheelhouse
    stamp, recorded as a label so a changed specdeploy rebuilds the image)."""
    ps = patch_set_id(engine, version, patches)
    base = standin_image(engine, version) if sandbox else upstream_image(engine, version)
    args = {VERSION_ARGS[engine]: version, "PATCH_SET": ps, "BASE_IMAGE": base, "SPECDEPLOY_SOURCE": source}
    if sandbox:
        args["OFFLINE"] = "1"  # no package index reachable: the wheelhouse alone
        if engine == "vllm":
            args["IMPORT_CHECK"] = "0"  # the stand-in has vLLM's Python sources but no torch
    out = {"tag": tag or image_tag(engine, version, patches), "base": base, "patch_set": ps,
           "patches": list(required_patches(engine, version)) if patches == "auto" else [],
           "version_arg": VERSION_ARGS[engine], "dockerfile": f"docker/{engine}.Dockerfile",
           "build_args": args, "sandbox": None}
    if sandbox:
        out["sandbox"] = {"dockerfile": "docker/sandbox-engine.Dockerfile", "tag": base,
                          "build_args": {"ENGINE": engine, "ENGINE_VERSION": version}}
    return out


def standin_context(engine: str, version: str, out) -> str:
    """Write the sandbox stand-in's build context into ``out`` (on the controller, which can reach the package
    index): the Dockerfile and the engine's real Python sources from its release (vLLM sdist, SGLang wheel),
    fetched and sha256-checked by :mod:`specdeploy.upstream`. Returns a stamp of the context."""
    import hashlib
    import shutil
    from pathlib import Path

    from . import upstream
    out = Path(out)
    stamp_file = out / "STAMP"
    stamp = f"{engine}-{version}-" + hashlib.sha256(
        (Path(__file__).resolve().parents[2] / "docker/sandbox-engine.Dockerfile").read_bytes()).hexdigest()[:12]
    if stamp_file.is_file() and stamp_file.read_text().strip() == stamp:
        return stamp
    shutil.rmtree(out, ignore_errors=True)
    (out / "engine-src").mkdir(parents=True)
    shutil.copy(Path(__file__).resolve().parents[2] / "docker/sandbox-engine.Dockerfile", out / "Dockerfile")
    if engine == "vllm":
        shutil.copytree(upstream.vllm_source(version) / "vllm", out / "engine-src/vllm")
    else:
        # No SGLang patches exist; the package's own __init__ and version are enough to locate and name it.
        src = upstream.sglang_source(version) / "sglang"
        (out / "engine-src/sglang").mkdir()
        for name in ("__init__.py", "version.py"):
            if (src / name).is_file():
                shutil.copy(src / name, out / "engine-src/sglang" / name)
    stamp_file.write_text(stamp + "\n")
    return stamp
