"""Content-keyed, atomic, locked caches for the sandbox (the rootfs, the base image, the model artifacts).

A cache entry is valid only when its key, a hash of everything that produced it, equals the key wanted now;
existence alone never counts. An entry is built in a fresh directory beside its final place and renamed into
place when complete, under a lock, so a build that fails or is killed leaves no partial entry, and two builds at
once wait for each other instead of writing into one directory.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from specdeploy.values.errors import Finding, SpecdeployError

KEY_FILE = ".specdeploy-key"


def inputs_key(*parts) -> str:
    """sha256 over the inputs: strings, bytes, files (their bytes), directories (every file, by relative path),
    and functions (their source)."""
    h = hashlib.sha256()
    for p in parts:
        if callable(p):
            p = inspect.getsource(p)
        if isinstance(p, Path):
            files = sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p]
            for f in files:
                h.update(str(f.relative_to(p) if p.is_dir() else f.name).encode() + b"\0")
                h.update(f.read_bytes())
            h.update(b"\1")
            continue
        h.update((p if isinstance(p, bytes) else str(p).encode()) + b"\0")
    return h.hexdigest()


def key_of(entry: Path) -> str | None:
    f = entry / KEY_FILE
    try:
        return f.read_text().strip() if f.is_file() else None
    except (OSError, UnicodeDecodeError):
        return None


@contextlib.contextmanager
def locked(lock: Path, what: str, progress=None, timeout: float = 3600) -> Iterator[None]:
    """An exclusive flock on ``lock``; waits (saying so) while another process holds it."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                progress(f"waiting for another {what} to finish (lock {lock})")
            t0 = time.monotonic()
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() - t0 > timeout:
                        raise SpecdeployError([Finding(
                            "error", what, f"another {what} has held {lock} for over {timeout:.0f} s",
                            "wait for it to finish, or stop it (fuser -v " + str(lock) + ")")]) from None
                    time.sleep(0.5)
        yield
    finally:
        os.close(fd)


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below ``path`` (from /proc/self/mountinfo), deepest first."""
    root = os.path.abspath(path)
    out = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) > 4:
            mp = fields[4].encode().decode("unicode_escape")
            if mp == root or mp.startswith(root.rstrip("/") + "/"):
                out.append(Path(mp))
    return sorted(set(out), key=lambda p: len(p.parts), reverse=True)


def unmount_under(path: Path) -> list[Path]:
    """Unmount everything mounted at or below ``path`` (what a failed debootstrap leaves: proc, sys, dev/pts);
    returns what is still mounted."""
    for mp in mounts_under(path):
        subprocess.run(["umount", "-l", str(mp)], capture_output=True)
    return mounts_under(path)


def remove_tree(path: Path):
    """rm -r that never crosses into a mount: anything still mounted below ``path`` stops it with an error."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()  # a link is removed, never followed: what it points to is not ours
        return
    if not path.exists():
        return
    left = unmount_under(path)
    if left:
        raise SpecdeployError([Finding("error", str(path), f"still mounted below it: {', '.join(map(str, left))}",
                                       f"unmount those (umount -l), then remove {path}")])
    shutil.rmtree(path)


def _readable(entry: Path) -> Path:
    """An entry made before entries were made 0755 (mkdtemp's 0700) is opened to readers; nothing else changes."""
    if not entry.is_symlink() and entry.is_dir() and entry.stat().st_mode & 0o777 == 0o700:
        os.chmod(entry, 0o755)
    return entry


def build_entry(final: Path, key: str, build: Callable[[Path], None], lock: Path, what: str,
                progress=None) -> Path:
    """``final`` holding exactly what ``build`` writes for ``key``: reused when its key matches, otherwise built
    beside it and switched in by rename; an entry built from other inputs is replaced."""
    if key_of(final) == key:
        return _readable(final)
    with locked(lock, what, progress):
        if key_of(final) == key:  # built by whoever held the lock before us
            return _readable(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.build-", dir=final.parent))
        os.chmod(tmp, 0o755)  # an entry is read by others too (a sandbox host's service user runs a cached venv)
        try:
            build(tmp)
            (tmp / KEY_FILE).write_text(key + "\n")
            old = None
            if final.exists() or final.is_symlink():
                old = final.parent / f".{final.name}.old-{os.getpid()}-{time.monotonic_ns()}"
                final.rename(old)
            tmp.rename(final)
            if old is not None:
                remove_tree(old)
        except BaseException:
            remove_tree(tmp)
            raise
    return final


def prune(parent: Path, pattern: str, keep: Path, in_use: Callable[[Path], bool] = lambda p: False):
    """Remove the other entries matching ``pattern`` in ``parent`` (older keys), except those in use, and the
    build and old directories a killed build left (``.<pattern>.build-*``, ``.<pattern>.old-*``). Call it holding
    the entry's lock, so no build in progress is among them."""
    for p in [*parent.glob(pattern), *parent.glob(f".{pattern}.build-*"), *parent.glob(f".{pattern}.old-*")]:
        if p.resolve() == keep.resolve() or in_use(p):
            continue
        with contextlib.suppress(SpecdeployError, OSError):
            remove_tree(p)
