"""Host files in one call: specdeploy's state and config directories, and its small marks read together.

A loop of Ansible's ``file`` or ``slurp`` module starts the host's Python once per item (about a quarter of a CPU
second each); every deploy makes and reads these on every host, twice where a host is also the router's, so one
call per host for each list keeps that cost off every deploy. Host side only: this file run as a plain script with
the host's python3 (standard library only), fed on stdin (``specdeploy_host_script``):

    python3 - dirs [--check] PATH:MODE:OWNER ...   each a directory with that mode (octal) and owner; prints
                                                   {"changed": [PATH ...]} (under --check what would change)
    python3 - read PATH ...                        prints {PATH: its first 4 KiB as text, "" where absent}

A directory's parents are made (0755, root) where missing. A link to a directory is followed, as Ansible's ``file``
module follows it (a state directory moved to a larger disk and linked back); a path that is there and not a
directory is an error that names it, and nothing after it changes.
"""
from __future__ import annotations

import json
import os
import pwd
import stat
import sys

MAX_READ = 4096


def _spec(text: str) -> tuple[str, int, str]:
    path, mode, owner = text.rsplit(":", 2)
    if not path.startswith("/") or "\0" in path:
        raise ValueError(f"not an absolute path: {path!r}")
    return path, int(mode, 8), owner


def dirs(specs: list[str], check: bool = False) -> list[str]:
    changed = []
    for text in specs:
        path, mode, owner = _spec(text)
        uid = pwd.getpwnam(owner).pw_uid
        try:
            st = os.stat(path)
        except FileNotFoundError:
            changed.append(path)
            if not check:
                os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                os.mkdir(path, mode)
                os.chmod(path, mode)  # mkdir's mode passes through the umask
                os.chown(path, uid, -1)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise ValueError(f"{path} is there and is not a directory: move it aside, and the deploy makes the "
                             "directory")
        if stat.S_IMODE(st.st_mode) != mode or st.st_uid != uid:
            changed.append(path)
            if not check:
                os.chmod(path, mode)
                os.chown(path, uid, -1)
    return changed


def read(paths: list[str]) -> dict[str, str]:
    out = {}
    for path in paths:
        try:
            with open(path, "rb") as fh:
                out[path] = fh.read(MAX_READ).decode("utf-8", "replace")
        except (FileNotFoundError, NotADirectoryError):
            out[path] = ""
    return out


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("dirs", "read"):
        print("usage: python3 - dirs [--check] PATH:MODE:OWNER ... | read PATH ...", file=sys.stderr)
        return 2
    try:
        if argv[0] == "dirs":
            check = "--check" in argv[1:]
            print(json.dumps({"changed": dirs([a for a in argv[1:] if a != "--check"], check)}))
        else:
            print(json.dumps(read(argv[1:])))
    except (OSError, KeyError, ValueError) as exc:
        print(f"specdeploy host files: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
