"""Warm a checkpoint into the host's page cache before the engine restarts, where the host's memory holds it.

Run by the host's own python3 (standard library only, nothing of specdeploy's imported), with the script on stdin:

    python3 - warm MODEL_DIR [--margin-gib G] [--max-seconds S] [--check]

Where no weight-cache daemon keeps the weights in GPU memory, every engine restart reads the whole checkpoint;
a checkpoint already in the page cache is read from memory instead of disk. Before reading anything this checks
that it fits: the checkpoint's weight files (the safetensors index's, else every ``*.safetensors``) against the
kernel's ``MemAvailable`` (/proc/meminfo, which counts reclaimable page cache), less a margin (``--margin-gib``,
default 10% of ``MemTotal``, at least 8 GiB) for what the engine and the host need themselves. It is checked, never
assumed: a checkpoint that does not fit is not read (the answer says so, and by how much). Reading is sequential,
file by file, in 16 MiB blocks with ``posix_fadvise(WILLNEED)`` first; it stops at ``--max-seconds``. ``--check``
only answers whether it fits.

Prints one JSON object: ``fits``, ``bytes``, ``available``, ``margin``, ``files``, and for a warm ``read_bytes``,
``seconds``, ``mb_per_s`` (the read speed of what was not cached yet is the disk's), ``complete``. Exit 0 in every
case that is an answer (a checkpoint that does not fit is an answer), 2 on bad input.
"""
from __future__ import annotations

import json
import os
import sys
import time

BLOCK = 16 << 20
GIB = 1 << 30
MAX_INDEX_BYTES = 64 << 20
MAX_FILES = 100_000


def meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """/proc/meminfo in bytes (the kernel writes kB)."""
    out: dict[str, int] = {}
    with open(path) as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[key.strip()] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def weight_files(model: str) -> list[str]:
    """The checkpoint's weight files: those its safetensors index names (each once, in order), else every
    ``*.safetensors`` in the directory. Regular files only; a name that leaves the directory is refused."""
    root = os.path.realpath(model)
    index = os.path.join(root, "model.safetensors.index.json")
    names: list[str] = []
    if os.path.isfile(index):
        if os.path.getsize(index) > MAX_INDEX_BYTES:
            raise ValueError(f"{index} is larger than {MAX_INDEX_BYTES >> 20} MiB")
        with open(index) as f:
            data = json.load(f)
        wm = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(wm, dict):
            raise ValueError(f"{index} has no weight_map")
        for v in wm.values():
            if isinstance(v, str) and v not in names:
                names.append(v)
    else:
        names = sorted(n for n in os.listdir(root) if n.endswith(".safetensors"))
    out = []
    for n in names[:MAX_FILES]:
        p = os.path.realpath(os.path.join(root, n))
        if os.path.dirname(p) != root and not p.startswith(root + os.sep):
            raise ValueError(f"{n} in the index leaves {model}")
        if os.path.isfile(p):
            out.append(p)
    return out


def plan(model: str, margin: int | None, mem: dict[str, int]) -> dict:
    files = weight_files(model)
    size = sum(os.path.getsize(p) for p in files)
    total, available = mem.get("MemTotal", 0), mem.get("MemAvailable", 0)
    margin = margin if margin is not None else max(8 * GIB, total // 10)
    fits = bool(files) and size + margin <= available
    return {"model": model, "files": len(files), "bytes": size, "available": available, "total": total,
            "margin": margin, "fits": fits, "short_by": max(0, size + margin - available), "_paths": files}


def warm(paths: list[str], max_seconds: float, clock=time.monotonic) -> dict:
    t0, read = clock(), 0
    complete = True
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            while True:
                if clock() - t0 > max_seconds:
                    complete = False
                    break
                chunk = os.read(fd, BLOCK)
                if not chunk:
                    break
                read += len(chunk)
        finally:
            os.close(fd)
        if not complete:
            break
    secs = max(clock() - t0, 1e-9)
    return {"read_bytes": read, "seconds": round(secs, 2), "mb_per_s": round(read / secs / 1e6, 1),
            "complete": complete}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "warm":
        print("usage: warm MODEL_DIR [--margin-gib G] [--max-seconds S] [--check]", file=sys.stderr)
        return 2
    model, rest = argv[1], argv[2:]
    margin, max_s, check = None, 3600.0, False
    try:
        while rest:
            a = rest.pop(0)
            if a == "--check":
                check = True
            elif a in ("--margin-gib", "--max-seconds") and rest:
                v = float(rest.pop(0))
                if not 0 <= v < 1e7:
                    raise ValueError(f"{a} {v} is out of range")
                if a == "--margin-gib":
                    margin = int(v * GIB)
                else:
                    max_s = v
            else:
                raise ValueError(f"unknown argument {a!r}")
        if not os.path.isdir(model):
            raise ValueError(f"{model} is not a directory")
        out = plan(model, margin, meminfo())
    except (OSError, ValueError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    paths = out.pop("_paths")
    if out["fits"] and not check:
        out.update(warm(paths, max_s))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
