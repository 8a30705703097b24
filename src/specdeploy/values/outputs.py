"""The one rule for what a command writes on the controller, which runs as root.

- A path the tool may never write: the filesystem root, a system directory or anything inside one
  (:data:`SYSTEM_DIRS`, ``/var/tmp`` and specdeploy's own state directory excepted), the home directory itself,
  ``/home`` and each entry of it (a user's home), and the working directory itself (``--out .`` or
  ``--out ''``). Checked on the path as given and on the path with its links resolved.
- A file the tool did not write is never written into or replaced: an existing output is replaced only when it
  carries the command's mark (each format its own: a JSON key, a PNG text chunk, a comment line), recognised by
  the ``recognise`` function the command passes; a link, a directory, a FIFO, a socket or a device is refused.
- A write goes to a new file beside the target and is renamed in: a failure or Ctrl-C at any point leaves the
  previous file as it was (and no temporary file behind).
- A log the tool appends to during a run (the deploy's event log) is created exclusively
  (:func:`create_exclusive`): an existing file is refused, never appended to or narrowed.

Whole output directories follow the same rule through :mod:`specdeploy.plan.outdir`, which uses :func:`forbidden`.
Every refusal is a :class:`SpecdeployError` naming the option, the path and the fix, raised before any work.
"""
from __future__ import annotations

import errno
import os
import stat
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from specdeploy.values.errors import Finding, SpecdeployError
from specdeploy.values.hostpaths import STATE_DIR
from specdeploy.values.terminal import safe

SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
               "/snap", "/sys", "/usr", "/var")
# /var/tmp, and specdeploy's own state directory on a host (a drafter conversion there is `drafter convert --out`)
SYSTEM_EXCEPT = ("/var/tmp", STATE_DIR)
HOMES = "/home"  # refused, and so is each of its entries (someone's home directory)
JSON_MARK = "specdeploy_output"  # the key a JSON output carries: the command that wrote it
PNG_MARK = "specdeploy"          # the PNG text chunk's keyword: the command that wrote it
TEXT_MARK = "# written by `specdeploy {command}`"  # the first line of a text output that takes comments
MARK_BYTES = 1 << 20  # how much of an existing file is read to find its mark


def refuse(option: str, path: object, why: str, fix: str) -> SpecdeployError:
    return SpecdeployError([Finding("error", option, f"{safe(path)}: {why}", fix)])


def _inside(a: Path, b: Path) -> bool:
    return a == b or b in a.parents


def _real(p: Path) -> Path:
    try:
        return Path(os.path.realpath(p))
    except (OSError, ValueError):
        return p


def forbidden(path: str | os.PathLike) -> str | None:
    """Why ``path`` may never be an output (as given, or with its links resolved), or None."""
    raw = os.fspath(path)
    if raw in ("", "."):
        return "is the working directory itself"
    if "\x00" in raw:
        return "holds a NUL character"
    lexical = Path(os.path.normpath(os.path.abspath(raw)))
    home = os.environ.get("HOME") or os.path.expanduser("~")
    places = {"the working directory itself": {Path.cwd(), _real(Path.cwd())},
              "the home directory itself": {Path(os.path.normpath(home)), _real(Path(home))} if home else set()}
    for p in dict.fromkeys((lexical, _real(lexical))):
        if p == Path(p.anchor):
            return "is the root of the filesystem"
        for what, where in places.items():
            if p in where:
                return f"is {what}"
        if str(p) == HOMES:
            return "holds the users' home directories"
        if str(p.parent) == HOMES:
            return "is a user's home directory"
        for d in SYSTEM_DIRS:
            if _inside(p, Path(d)) and not any(_inside(p, Path(x)) for x in SYSTEM_EXCEPT):
                return f"is {'inside ' if str(p) != d else ''}the system directory {d}"
    return None


def check_forbidden(path: str | os.PathLike, option: str, what: str) -> None:
    why = forbidden(path)
    if why:
        raise refuse(option, path if os.fspath(path) else "''", f"{why}; specdeploy never writes there",
                     f"give {what} of its own, e.g. a new directory under /srv, /tmp or your project")


def _kind(st: os.stat_result) -> str:
    m = st.st_mode
    return ("a symbolic link" if stat.S_ISLNK(m) else "a directory" if stat.S_ISDIR(m) else
            "a FIFO" if stat.S_ISFIFO(m) else "a socket" if stat.S_ISSOCK(m) else
            "a device" if stat.S_ISCHR(m) or stat.S_ISBLK(m) else "not a regular file")


def check_file(out: str | os.PathLike, option: str, command: str,
               recognise: Callable[[Path], bool] | None = None, what: str = "a new file path") -> Path:
    """Refuse an output file ``command`` may not write (see the module); returns it as a Path. ``recognise``:
    whether an existing regular file is an earlier output of ``command`` (None: no existing file is replaced)."""
    check_forbidden(out, option, what)
    out = Path(out)
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise refuse(option, out, f"cannot be examined ({exc.strerror or exc})", f"give {what}") from None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            raise refuse(option, out, f"exists and is {_kind(st)}; specdeploy writes only files it created there",
                         f"give {what}")
        if recognise is None or not _recognised(recognise, out):
            raise refuse(option, out, f"exists and was not written by `specdeploy {command}`; specdeploy does not "
                         "replace files it did not write", f"give {what}, or remove {safe(out)} yourself if you no "
                         "longer need it")
    parent = next((p for p in Path(os.path.abspath(out)).parents if os.path.lexists(p)), None)
    if parent is not None and not parent.is_dir():
        raise refuse(option, out, f"{safe(parent)} is not a directory", f"give {what} in a directory")
    return out


def _recognised(recognise: Callable[[Path], bool], path: Path) -> bool:
    try:
        return bool(recognise(path))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return False


def _head(path: Path, n: int = MARK_BYTES) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return os.read(fd, n)
    finally:
        os.close(fd)


def json_marked(command: str) -> Callable[[Path], bool]:
    """Recognise a JSON object output whose ``specdeploy_output`` key names ``command``."""
    def rec(path: Path) -> bool:
        from specdeploy.values.bounded import loads
        size = os.lstat(path).st_size
        if size > 256 << 20:
            return False
        with open(path, "rb") as f:
            data = loads(f.read(size + 1).decode("utf-8"))
        return isinstance(data, dict) and data.get(JSON_MARK) == command
    return rec


def png_marked(command: str) -> Callable[[Path], bool]:
    """Recognise a PNG whose ``specdeploy`` text chunk names ``command`` (chunks before the image data)."""
    def rec(path: Path) -> bool:
        head = _head(path)
        if not head.startswith(b"\x89PNG\r\n\x1a\n"):
            return False
        i = 8
        while i + 8 <= len(head):
            n = int.from_bytes(head[i:i + 4], "big")
            kind = head[i + 4:i + 8]
            body = head[i + 8:i + 8 + n]
            if kind == b"tEXt" and body == f"{PNG_MARK}\x00{command}".encode("latin-1"):
                return True
            if kind in (b"IDAT", b"IEND"):
                return False
            i += 12 + n
        return False
    return rec


def text_marked(command: str) -> Callable[[Path], bool]:
    """Recognise a text output whose first line is :data:`TEXT_MARK` for ``command``."""
    mark = TEXT_MARK.format(command=command).encode()

    def rec(path: Path) -> bool:
        return _head(path, len(mark) + 2).split(b"\n", 1)[0].rstrip(b"\r") == mark
    return rec


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


@contextmanager
def staged_file(out: str | os.PathLike, option: str, command: str,
                recognise: Callable[[Path], bool] | None = None, what: str = "a new file path",
                mode: int | None = None) -> Iterator[Path]:
    """Yield a new, empty file beside ``out`` to write (by path); on success rename it to ``out`` (replacing an
    earlier output of ``command`` only); on any failure, Ctrl-C included, remove it and leave ``out`` as it was.
    ``mode``: the new file's mode (default: an earlier output's, else 0666 less the umask)."""
    out = check_file(out, option, command, recognise, what)
    parent = Path(os.path.abspath(out)).parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise refuse(option, out, f"its directory cannot be created ({exc.strerror or exc})",
                     f"give {what} in a writable directory") from None
    tmp = parent / f".{out.name[:200]}.specdeploy-new-{uuid.uuid4().hex[:8]}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError as exc:
        raise refuse(option, out, f"cannot write beside it ({exc.strerror or exc})",
                     f"give {what} in a writable directory") from None
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        check_file(out, option, command, recognise, what)  # nothing else appeared there meanwhile
        try:
            old = os.lstat(out)
        except FileNotFoundError:
            old = None
        os.chmod(tmp, mode if mode is not None else stat.S_IMODE(old.st_mode) if old else 0o666 & ~_umask())
        if old is not None:
            os.replace(tmp, out)
        else:
            _link_new(tmp, out, option, what)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def _link_new(tmp: Path, out: Path, option: str, what: str) -> None:
    """Put ``tmp`` at ``out`` only if nothing is there (a file that appeared since the check is not replaced)."""
    try:
        os.link(tmp, out)
    except FileExistsError:
        raise refuse(option, out, "appeared while specdeploy wrote it; specdeploy does not replace it",
                     f"give {what}") from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS):
            raise
        if os.path.lexists(out):
            raise refuse(option, out, "appeared while specdeploy wrote it; specdeploy does not replace it",
                         f"give {what}") from None
        os.rename(tmp, out)


def write_file(out: str | os.PathLike, data: bytes | str, option: str, command: str,
               recognise: Callable[[Path], bool] | None = None, what: str = "a new file path",
               mode: int | None = None) -> Path:
    """:func:`staged_file` for content at hand."""
    with staged_file(out, option, command, recognise, what, mode) as tmp:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
    return Path(out)


def create_exclusive(path: str | os.PathLike, option: str, what: str = "a new file path",
                     dir_mode: int = 0o700) -> int:
    """A new file at ``path`` only its owner reads (0600), opened for writing: an existing file, a link, or a path
    the rule forbids is refused. Missing parents are made ``dir_mode``. Returns the file descriptor."""
    check_forbidden(path, option, what)
    p = Path(path)
    parent = Path(os.path.abspath(p)).parent
    try:
        missing = [d for d in [parent, *parent.parents] if not os.path.lexists(d)]
        for d in reversed(missing):
            os.mkdir(d, dir_mode)
        return os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                       0o600)
    except FileExistsError:
        raise refuse(option, p, "exists; specdeploy writes this log as a new file each run and never appends to "
                     "or changes a file it did not create", f"give {what} (or leave the option out)") from None
    except OSError as exc:
        raise refuse(option, p, f"cannot be created ({exc.strerror or exc})",
                     f"give {what} in a writable directory") from None


def save_png(fig, out: str | os.PathLike, option: str, command: str, **savefig) -> Path:
    """A matplotlib figure written to ``out`` by the rule, as PNG with the command's mark (a text chunk), so that
    the next run recognises it as its own; ``out`` gets exactly that name (no suffix added)."""
    meta = {PNG_MARK: command}
    with staged_file(out, option, command, png_marked(command), "a new PNG file path") as tmp:
        with open(tmp, "wb") as f:
            fig.savefig(f, format="png", metadata=meta, **savefig)
    return Path(out)


def check_png(out: str | os.PathLike, option: str, command: str) -> Path:
    """A chart's output: a path ending in .png (the suffix checked before any work, not when the chart is saved)
    that the rule lets ``command`` write."""
    check_forbidden(out, option, "a new PNG file path")
    if Path(out).suffix.lower() != ".png":
        raise refuse(option, out, "does not end in .png; the chart is a PNG image", "give a path ending in .png")
    return check_file(out, option, command, png_marked(command), "a new PNG file path")
