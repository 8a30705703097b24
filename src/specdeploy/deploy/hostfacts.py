"""What a role needs to know of its host, decided here so no role builds a path, names a unit or decides what the
engine serves: the engine and its release, whether a drafter checkpoint is served, the host paths and units that
belong to them, and how a host script runs."""
from __future__ import annotations

from specdeploy.engines import get, names
from specdeploy.plan.render.paths import converted_drafter_path
from specdeploy.values.hostpaths import host_path, unit_name

# The stdlib-only scripts a role runs on a host with the host's own python3 (fed on stdin: nothing needs to be
# installed there first, and nothing is left behind).
HOST_SCRIPTS = ("staging", "converged", "pagecache", "files")


def host_facts(hv) -> dict:
    """The engine, its release (and why), whether a drafter checkpoint is staged and converted, and the paths and
    units that belong to the engine on the host."""
    engine = hv.specdeploy_engine
    return {
        "engine": engine, "version": hv.specdeploy_engine_version, "label": get(engine).label,
        "release_choice": hv.release_choice(),
        "uses_drafter": hv.uses_drafter,
        "drafter_out": converted_drafter_path(hv) or "",
        "drafter_earlier": host_path("drafter_earlier", engine),
        "units": {"engine": unit_name("engine", engine), "exporter": unit_name("exporter"),
                  "router": unit_name("router"), "engines": [unit_name("engine", e) for e in names()],
                  "weight_cache": unit_name("weight_cache", engine)},
        "weight_cache": {"sockets": host_path("weight_cache_sockets", engine),
                         "key": host_path("weight_cache_key", engine),
                         "record": host_path("weight_cache_record", engine)},
        "standin_build": host_path("standin_build", engine),
    }


def host_script(name: str, args: list[str]) -> dict:
    """``{argv, script}``: the arguments after the host's python3 (``-`` reads the script from stdin) and the
    controller path of the script to feed it."""
    if name not in HOST_SCRIPTS:
        raise KeyError(f"no host script {name!r}; known: {', '.join(HOST_SCRIPTS)}")
    from specdeploy.hostscripts import converged, files, pagecache, staging
    module = {"staging": staging, "converged": converged, "pagecache": pagecache, "files": files}[name]
    return {"argv": ["-", *args], "script": module.__file__}


FILTERS: dict = {}
