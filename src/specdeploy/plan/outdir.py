"""Output directories of commands that write a whole directory (``drafter convert --out``, ``engine standin
--out``, ``wheelhouse --out``): written beside the target and renamed into place, never over someone else's files.

An output is marked with :data:`MARKER`, a small JSON file naming the command that wrote it. ``--out`` may be a
path that does not exist, or a previous output of the same command (replaced atomically: the old one is renamed
aside, the new one renamed in, then the old one removed). Anything else (a directory with other files, a file,
the input directory or a directory holding it) is refused before anything is written. On failure the temporary
directory is removed and the target is left as it was.
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from specdeploy.values.errors import Finding, SpecdeployError

MARKER = ".specdeploy-output"
_HOW = "choose a new --out path, or remove {out} yourself if you no longer need what it holds"


def _refuse(out: Path, why: str) -> SpecdeployError:
    return SpecdeployError([Finding("error", "--out", f"{out}: {why}", _HOW.format(out=out))])


def written_by(path: Path) -> str | None:
    """The command that wrote the output directory ``path`` (from its marker), or None."""
    try:
        data = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data.get("command") if isinstance(data, dict) else None


def _inside(a: Path, b: Path) -> bool:
    """``a`` is ``b`` or inside it (both resolved)."""
    return a == b or b in a.parents


def check_target(out: Path, command: str, inputs: Sequence[Path] = (),
                 legacy: Callable[[Path], bool] | None = None) -> Path:
    """Refuse an ``--out`` this command may not replace; returns it resolved. ``legacy``: recognises an output
    the command wrote before outputs were marked."""
    out = Path(out)
    res = out.resolve()
    for inp in inputs:
        ri = Path(inp).resolve()
        if _inside(ri, res):
            raise _refuse(out, f"is or contains the input directory {inp}; writing there would replace the input")
        if _inside(res, ri):
            raise _refuse(out, f"is inside the input directory {inp}; write the output elsewhere")
    if res == Path(res.anchor):
        raise _refuse(out, "is a filesystem root")
    if out.is_symlink() or os.path.lexists(out):
        if out.is_symlink() or not out.is_dir():
            raise _refuse(out, "exists and is not a directory this command wrote")
        if written_by(out) == command or (legacy is not None and written_by(out) is None and legacy(out)):
            return res
        if not any(out.iterdir()):
            return res  # an empty directory holds nothing to lose
        raise _refuse(out, f"exists and is not an output of `specdeploy {command}` (no {MARKER} naming it)")
    return res


@contextmanager
def atomic_output_dir(out: Path, command: str, inputs: Sequence[Path] = (),
                      legacy: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """Yield a new, empty directory beside ``out`` to write into; on success mark it and rename it to ``out``
    (replacing a previous output of the same ``command``); on any failure remove it and leave ``out`` alone."""
    out = Path(out)
    check_target(out, command, inputs, legacy)
    parent = out.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _refuse(out, f"cannot create its parent directory: {exc.strerror or exc}") from None
    tag = uuid.uuid4().hex[:8]
    tmp = parent / f".{out.name}.specdeploy-new-{tag}"
    old = parent / f".{out.name}.specdeploy-old-{tag}"
    try:
        tmp.mkdir()
    except OSError as exc:
        raise _refuse(out, f"cannot write beside it: {exc.strerror or exc}") from None
    try:
        yield tmp
        marker = tmp / MARKER
        marker.unlink(missing_ok=True)  # a copied or hard-linked marker of the input: never write through it
        marker.write_text(json.dumps({"command": command}) + "\n")
        check_target(out, command, inputs, legacy)  # nothing else appeared there meanwhile
        if os.path.lexists(out):
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
