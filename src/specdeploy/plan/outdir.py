"""Output directories of commands that write a whole directory (``plan --out``, ``gate --out``, ``canary --out``,
``drafter convert --out``, ``engine standin --out``, ``wheelhouse --out``): written beside the target and renamed
into place, never over someone else's files (the rule of :mod:`specdeploy.values.outputs`, for directories).

An output is marked with :data:`MARKER`, a small JSON file naming the command that wrote it and every file it
wrote (its manifest). ``--out`` may be a path that does not exist, an empty directory (taken over, its mode kept),
or a previous output of the same command that holds nothing but what the command wrote there (replaced: the old
one is renamed aside, the new one renamed in, then the old one removed). Anything else is refused before anything
is written: a directory with other files, a previous output to which someone added files (naming them), a file, a
link, the input directory or a directory holding it, and the paths :func:`values.outputs.forbidden` names (the
filesystem root, system directories, the home and the working directory themselves). On failure or Ctrl-C the
temporary directory is removed and the target is left as it was.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from specdeploy.values.errors import Finding, SpecdeployError
from specdeploy.values.outputs import forbidden
from specdeploy.values.terminal import safe

MARKER = ".specdeploy-output"
MAX_MANIFEST = 1 << 20
_HOW = "choose a new --out path, or remove {out} yourself if you no longer need what it holds"


def _refuse(out: Path, why: str, how: str = _HOW) -> SpecdeployError:
    return SpecdeployError([Finding("error", "--out", f"{safe(out)}: {why}", how.format(out=safe(out)))])


def _marker(path: Path) -> dict | None:
    try:
        from specdeploy.values.bounded import loads, read_regular
        data = loads(read_regular(path / MARKER, MAX_MANIFEST))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def written_by(path: Path) -> str | None:
    """The command that wrote the output directory ``path`` (from its marker), or None."""
    data = _marker(path)
    return data.get("command") if data else None


def _inside(a: Path, b: Path) -> bool:
    """``a`` is ``b`` or inside it (both resolved)."""
    return a == b or b in a.parents


def _listing(root: Path) -> set[str]:
    """Every file, link and directory under ``root``, relative, directories with a trailing slash."""
    out: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        for n in dirnames:
            p = Path(dirpath) / n
            out.add(str(rel / n) + ("" if p.is_symlink() else "/"))
        for n in filenames:
            out.add(str(rel / n))
    out.discard(MARKER)
    return out


def foreign_entries(path: Path, command: str) -> list[str]:
    """What an earlier output of ``command`` holds beyond its manifest (files someone added); [] for an output
    without a manifest (written before manifests were kept)."""
    data = _marker(path) or {}
    files = data.get("files")
    if data.get("command") != command or not isinstance(files, list):
        return []
    return sorted(_listing(path) - {str(f) for f in files})


def check_target(out: Path, command: str, inputs: Sequence[Path] = (),
                 legacy: Callable[[Path], bool] | None = None) -> Path:
    """Refuse an ``--out`` this command may not replace; returns it resolved. ``legacy``: recognises an output
    the command wrote before outputs were marked."""
    out = Path(out)
    why = forbidden(out)
    if why:
        raise _refuse(out if str(out) not in ("", ".") else Path("."), f"{why}; specdeploy never writes there",
                      "give --out a new directory of its own, e.g. under /srv, /tmp or your project")
    res = out.resolve()
    for inp in inputs:
        ri = Path(inp).resolve()
        if _inside(ri, res):
            raise _refuse(out, f"is or contains the input directory {safe(inp)}; writing there would replace the "
                          "input")
        if _inside(res, ri):
            raise _refuse(out, f"is inside the input directory {safe(inp)}; write the output elsewhere")
    if res == Path(res.anchor):
        raise _refuse(out, "is a filesystem root")
    if out.is_symlink() or os.path.lexists(out):
        if out.is_symlink() or not out.is_dir():
            raise _refuse(out, "exists and is not a directory this command wrote")
        if written_by(out) == command:
            extra = foreign_entries(out, command)
            if extra:
                shown = ", ".join(safe(e) for e in extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5
                                                                 else "")
                raise _refuse(out, f"is an earlier output of `specdeploy {command}` to which other files were added "
                              f"({shown}); specdeploy does not delete what it did not write",
                              "move those files out of {out}, or choose a new --out path")
            return res
        if legacy is not None and written_by(out) is None and legacy(out):
            return res
        if not any(out.iterdir()):
            return res  # an empty directory holds nothing to lose
        raise _refuse(out, f"exists and is not an output of `specdeploy {command}` (no {MARKER} naming it)")
    parent = next((p for p in Path(os.path.abspath(out)).parents if os.path.lexists(p)), None)
    if parent is not None and not parent.is_dir():
        raise _refuse(out, f"{safe(parent)} is not a directory", "give --out a directory path")
    return res


@contextmanager
def atomic_output_dir(out: Path, command: str, inputs: Sequence[Path] = (),
                      legacy: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """Yield a new, empty directory beside ``out`` to write into; on success mark it (with the manifest of what
    it holds) and rename it to ``out`` (replacing a previous output of the same ``command``); on any failure,
    Ctrl-C included, remove it and leave ``out`` alone."""
    out = Path(out)
    check_target(out, command, inputs, legacy)
    parent = out.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _refuse(out, f"cannot create its parent directory: {exc.strerror or exc}") from None
    tag = uuid.uuid4().hex[:8]
    tmp = parent / f".{out.name[:200]}.specdeploy-new-{tag}"
    old = parent / f".{out.name[:200]}.specdeploy-old-{tag}"
    try:
        tmp.mkdir()
    except OSError as exc:
        raise _refuse(out, f"cannot write beside it: {exc.strerror or exc}") from None
    try:
        yield tmp
        marker = tmp / MARKER
        marker.unlink(missing_ok=True)  # a copied or hard-linked marker of the input: never write through it
        marker.write_text(json.dumps({"command": command, "files": sorted(_listing(tmp))}) + "\n")
        check_target(out, command, inputs, legacy)  # nothing else appeared there meanwhile
        if os.path.lexists(out):
            if not any(out.iterdir()):  # an empty directory taken over keeps its mode
                os.chmod(tmp, stat.S_IMODE(os.stat(out).st_mode))
            os.rename(out, old)
            try:
                os.rename(tmp, out)
            except BaseException:
                os.rename(old, out)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
