"""Engine images: names (the tag carries the engine version and the patch set) and how to build them.

Production builds ``docker/<engine>.Dockerfile`` FROM the official engine image. A sandbox host cannot reach
Docker Hub, so it builds the same Dockerfile FROM a local stand-in: the sandbox rootfs loaded into Docker plus
the engine's real Python sources (``docker/sandbox-engine.Dockerfile``), whose entry points run the simulator.
"""
from __future__ import annotations

from specdeploy.engines import get, get_adapter
from specdeploy.engines.patches import patch_set_id, required_patches


def upstream_image(engine: str, version: str) -> str:
    get_adapter(engine, version)  # an unknown engine or version is an error here, not a wrong tag
    return f"{get(engine).upstream_image}:v{version}"


def image_tag(engine: str, version: str, patches: str = "auto") -> str:
    return f"specdeploy/{engine}:{version}-{patch_set_id(engine, version, patches)}"


def standin_image(engine: str, version: str) -> str:
    """The sandbox's local stand-in for the official engine image."""
    return f"specdeploy-sandbox/{get(engine).upstream_image.split('/')[1]}:v{version}"


def build_plan(engine: str, version: str, patches: str = "auto", sandbox: bool = False,
               tag: str | None = None, source: str = "unknown") -> dict:
    """Everything the engine_image role needs to build a host's engine image (``source`` is the wheelhouse
    stamp, recorded as a label so a changed specdeploy rebuilds the image)."""
    ps = patch_set_id(engine, version, patches)
    base = standin_image(engine, version) if sandbox else upstream_image(engine, version)
    adapter = get(engine)
    args = {adapter.version_arg: version, "PATCH_SET": ps, "BASE_IMAGE": base, "SPECDEPLOY_SOURCE": source}
    if sandbox:
        args["OFFLINE"] = "1"  # no package index reachable: the wheelhouse alone
        args.update(adapter.standin_build_args)
    out = {"tag": tag or image_tag(engine, version, patches), "base": base, "patch_set": ps,
           "patches": list(required_patches(engine, version)) if patches == "auto" else [],
           "version_arg": adapter.version_arg, "dockerfile": f"docker/{engine}.Dockerfile",
           "build_args": args, "sandbox": None}
    if sandbox:
        out["sandbox"] = {"dockerfile": "docker/sandbox-engine.Dockerfile", "tag": base,
                          "build_args": {"ENGINE": engine, "ENGINE_VERSION": version}}
    return out


def standin_context(engine: str, version: str, out) -> str:
    """Write the sandbox stand-in's build context into ``out`` (on the controller, which can reach the package
    index): the Dockerfile and the engine's real Python sources from its release (vLLM sdist, SGLang wheel),
    fetched and sha256-checked by :mod:`specdeploy.engines.upstream`. Returns a stamp of the context.

    ``out`` is written beside itself and renamed into place (:mod:`specdeploy.plan.outdir`): it must not exist or be a
    previous stand-in context; when the sources cannot be had, ``out`` is left as it was."""
    import hashlib
    import shutil
    from pathlib import Path

    from specdeploy.engines import upstream
    from specdeploy.plan.outdir import atomic_output_dir, check_target
    out = Path(out)
    stamp_file = out / "STAMP"
    dockerfile = Path(__file__).resolve().parents[3] / "docker/sandbox-engine.Dockerfile"
    stamp = f"{engine}-{version}-" + hashlib.sha256(dockerfile.read_bytes()).hexdigest()[:12]

    def previous(path: Path) -> bool:  # a context written before outputs were marked
        s = path / "STAMP"
        return s.is_file() and s.read_text().strip().startswith(f"{engine}-") and (path / "engine-src").is_dir()

    check_target(out, STANDIN_CMD, (), previous)
    if stamp_file.is_file() and stamp_file.read_text().strip() == stamp:
        return stamp
    files = get(engine).standin_files  # None: the whole package (the patches apply to it)
    src = upstream.source(engine, version) / engine  # fetched before anything is written
    with atomic_output_dir(out, STANDIN_CMD, (), previous) as tmp:
        (tmp / "engine-src").mkdir()
        shutil.copy(dockerfile, tmp / "Dockerfile")
        if files is None:
            shutil.copytree(src, tmp / "engine-src" / engine)
        else:
            (tmp / "engine-src" / engine).mkdir()
            for name in files:
                if (src / name).is_file():
                    shutil.copy(src / name, tmp / "engine-src" / engine / name)
        (tmp / "STAMP").write_text(stamp + "\n")
    return stamp


STANDIN_CMD = "engine standin"
