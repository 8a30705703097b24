"""Model and drafter weights on a host: verify a checkpoint, copy one verified and resumable, switch atomically.

It runs inside specdeploy on the controller (preflight, tests, benchmarks) and as a plain script on hosts before
anything is installed there (``python3 staging.py verify DIR``): the standard library only, and nothing read but
safetensors headers (8-byte length plus JSON) unless a sha256 manifest is given.

Layout of a staged checkpoint: ``<parent>/.<name>.specdeploy/<id>/`` holds one complete copy per content id;
``<parent>/<name>`` is a symlink flipped with rename(2). A copy in progress lives in ``<id>.partial/`` with a
journal of verified files, so a killed copy resumes where it stopped. Nothing here deletes weights.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

INDEX = "model.safetensors.index.json"
JOURNAL = ".specdeploy-copy.json"
COMPLETE = ".specdeploy-complete.json"
CHUNK = 8 << 20
HOLE = 1 << 20
_ZERO = bytes(CHUNK)


@dataclass
class Problem:
    subject: str
    message: str
    fix: str = ""

    def line(self) -> str:
        return f"ERROR {self.subject}: {self.message}" + (f" Fix: {self.fix}" if self.fix else "")


@dataclass
class Verified:
    path: str
    files: int = 0
    bytes: int = 0
    hashed: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def header_implied_size(path: Path) -> tuple[int, set[str]]:
    """(file size the safetensors header implies, tensor names). Raises ValueError on a bad header."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise ValueError("shorter than a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n > 100_000_000:
            raise ValueError(f"header length {n} is not plausible")
        head = fh.read(n)
    if len(head) != n:
        raise ValueError(f"truncated inside its {n}-byte header")
    try:
        header = json.loads(head)
    except ValueError as exc:
        raise ValueError(f"header is not JSON ({exc})") from None
    end = 0
    for name, meta in header.items():
        if name != "__metadata__":
            end = max(end, int(meta["data_offsets"][1]))
    return 8 + n + end, {k for k in header if k != "__metadata__"}


def _rel_fix(variable: str) -> str:
    return f"complete the checkpoint at {variable} (copy the missing or partial files again), or point {variable} " \
           "at a complete one"


def _small_text(path: Path, limit: int) -> str:
    """A regular file's text, refused (ValueError) when larger than ``limit`` bytes: never read whole."""
    if path.stat().st_size > limit:
        raise ValueError(f"larger than {limit >> 20} MiB")
    return path.read_text()


def shard_names(directory: Path) -> tuple[list[str], list[Problem], dict[str, set[str]]]:
    """The shard files a checkpoint needs (from its index, else the *.safetensors present)."""
    idx = directory / INDEX
    problems: list[Problem] = []
    wanted: dict[str, set[str]] = {}
    if idx.is_file():
        try:
            weight_map = json.loads(_small_text(idx, 256 << 20))["weight_map"]
            for tensor, shard in weight_map.items():
                wanted.setdefault(str(shard), set()).add(str(tensor))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OSError) as exc:
            problems.append(Problem(str(idx), f"not a safetensors index ({exc.__class__.__name__}: {exc})",
                                    "copy the index again from the checkpoint's source"))
        return sorted(wanted), problems, wanted
    present = sorted(p.name for p in directory.glob("*.safetensors"))
    if len(present) > 1 or any("-of-" in p for p in present):
        problems.append(Problem(str(idx), f"missing, but {len(present)} shard files are present",
                                "copy model.safetensors.index.json from the checkpoint's source"))
    elif not present:
        problems.append(Problem(str(directory), "holds no *.safetensors weights",
                                "point the variable at the checkpoint directory (config.json, index, shards)"))
    return present, problems, {}


def _sha256(path: Path, bufsize: int = CHUNK) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(bufsize)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def read_manifest(path: Path) -> dict[str, str]:
    """sha256sum format: '<hex>  <relative path>' per line."""
    out = {}
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        if len(parts) != 2 or len(parts[0]) != 64:
            raise ValueError(f"{path}:{i}: not '<sha256>  <file>'")
        out[parts[1].strip().lstrip("*").removeprefix("./")] = parts[0].lower()
    return out


def _file_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def verify(directory: str | Path, variable: str = "specdeploy_model_path", manifest: str | Path | None = None,
           stamp: str | Path | None = None, write_stamp: bool = False, jobs: int = 4) -> Verified:
    """Check a checkpoint without reading weights: config.json, every shard its index names, each shard's size
    against its header, every indexed tensor in its shard. With a manifest, also the sha256 of each listed file;
    ``stamp`` remembers files hashed before (size, mtime, inode) so an unchanged checkpoint is not read again."""
    d = Path(directory)
    res = Verified(str(d))
    if not d.is_dir():
        res.problems.append(Problem(variable, f"{d} is not a directory",
                                    f"set {variable} to the checkpoint directory, or copy the checkpoint there"))
        return res
    cfg = d / "config.json"
    if not cfg.is_file():
        res.problems.append(Problem(variable, f"{cfg} is missing", _rel_fix(variable)))
    else:
        try:
            json.loads(_small_text(cfg, 16 << 20))
        except (ValueError, RecursionError, OSError) as exc:
            res.problems.append(Problem(variable, f"{cfg} is not JSON ({exc})", _rel_fix(variable)))
    shards, problems, wanted = shard_names(d)
    res.problems += [Problem(variable, f"{p.subject}: {p.message}", p.fix) for p in problems]
    missing = [s for s in shards if not (d / s).is_file()]
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        res.problems.append(Problem(variable, f"{len(missing)} of {len(shards)} shards named by {INDEX} are "
                                    f"missing in {d}: {', '.join(missing[:5])}{more}", _rel_fix(variable)))
    for s in shards:
        p = d / s
        if not p.is_file():
            continue
        size = p.stat().st_size
        res.files += 1
        res.bytes += size
        try:
            implied, names = header_implied_size(p)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            res.problems.append(Problem(variable, f"{p}: {exc}", _rel_fix(variable)))
            continue
        if size != implied:
            how = "truncated" if size < implied else "longer than its header says"
            res.problems.append(Problem(variable, f"{p} is {how}: {size} bytes, its header implies {implied}",
                                        _rel_fix(variable)))
        absent = wanted.get(s, set()) - names
        if absent:
            res.problems.append(Problem(variable, f"{p} lacks {len(absent)} tensors that {INDEX} places there, "
                                        f"e.g. {min(absent)}", "the index and the shards come from "
                                        "different checkpoints: copy both from one source"))
    if manifest:
        _verify_manifest(d, Path(manifest) if Path(manifest).is_absolute() else d / manifest, res, variable,
                         Path(stamp) if stamp else None, write_stamp, jobs)
    return res


def _verify_manifest(d: Path, mpath: Path, res: Verified, variable: str, stamp: Path | None, write: bool,
                     jobs: int):
    mvar = variable.replace("_path", "_sha256_manifest")
    if not mpath.is_file():
        res.problems.append(Problem(mvar, f"{mpath} does not exist", f"write it with `sha256sum` in the "
                                    f"checkpoint directory, or unset {mvar}"))
        return
    try:
        want = read_manifest(mpath)
    except ValueError as exc:
        res.problems.append(Problem(mvar, str(exc), "use the output format of `sha256sum`"))
        return
    known: dict = {}
    if stamp and stamp.is_file():
        try:
            known = json.loads(stamp.read_text()).get("files", {})
        except ValueError:
            known = {}
    todo, good = [], {}
    for name, digest in want.items():
        p = d / name
        if not p.is_file():
            res.problems.append(Problem(mvar, f"{p} is listed in {mpath.name} but missing", _rel_fix(variable)))
            continue
        key = _file_key(p.stat())
        if known.get(name) == [*key, digest]:
            good[name] = [*key, digest]
        else:
            todo.append((name, digest, key))
    with ThreadPoolExecutor(max(1, jobs)) as ex:
        for (name, digest, key), got in zip(todo, ex.map(lambda t: _sha256(d / t[0]), todo)):
            res.hashed += 1
            if got != digest:
                res.problems.append(Problem(mvar, f"{d / name}: sha256 {got[:16]}... differs from the manifest's "
                                            f"{digest[:16]}...", _rel_fix(variable)))
            else:
                good[name] = [*key, digest]
    if write and stamp and res.ok:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        tmp = stamp.with_name(stamp.name + ".tmp")
        tmp.write_text(json.dumps({"path": str(d), "files": good}))
        os.replace(tmp, stamp)


def listing(src: Path) -> list[tuple[str, int, int]]:
    """(relative path, size, mtime_ns) of every regular file, sorted; our own bookkeeping files excluded."""
    out = []
    for root, dirs, files in os.walk(src):
        dirs[:] = sorted(x for x in dirs if not x.startswith(".rsync-partial"))
        for f in files:
            if f in (JOURNAL, COMPLETE):
                continue
            p = Path(root) / f
            st = p.stat()
            out.append((str(p.relative_to(src)), st.st_size, st.st_mtime_ns))
    return sorted(out)


def tree_id(src: str | Path) -> str:
    """A content id from names, sizes and mtimes: no weights are read."""
    h = hashlib.sha256()
    for rel, size, mtime in listing(Path(src)):
        h.update(f"{rel}\0{size}\0{mtime}\n".encode())
    return h.hexdigest()[:16]


def store_of(link: str | Path) -> Path:
    link = Path(link)
    return link.parent / f".{link.name}.specdeploy"


class SwitchError(RuntimeError):
    pass


def switch(link: str | Path, target: str | Path, variable: str = "specdeploy_model_path") -> str | None:
    """Point ``link`` at ``target`` with one rename(2); returns the previous target. A real directory at ``link``
    (weights put there by hand) is never replaced: it is an error naming the way out."""
    link, target = Path(link), Path(target)
    prev = None
    if link.is_symlink():
        prev = os.readlink(link)
    elif link.exists():
        if link.is_dir() and not any(link.iterdir()):
            link.rmdir()  # an empty directory holds nothing
        else:
            raise SwitchError(f"{variable}: {link} is a directory with content, not a link specdeploy manages; "
                              f"its files are left as they are. Fix: use specdeploy_model_source: host for weights "
                              f"already there, or move {link} aside yourself")
    tmp = link.with_name(f".{link.name}.link-{os.getpid()}")
    if tmp.is_symlink():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)
    return prev


def prune(link: str | Path, keep: tuple = ()) -> list[str]:
    """Remove complete copies in ``link``'s store (specdeploy's own directory) other than the one ``link``
    points at and those in ``keep`` (the previous copy, kept until the new one serves). Partial copies stay:
    a rerun resumes them. Returns the removed paths."""
    import shutil
    link = Path(link)
    store = store_of(link)
    kept = {str(Path(k)) for k in keep if k}
    if link.is_symlink():
        kept.add(os.readlink(link))
    removed = []
    for d in sorted(store.iterdir()) if store.is_dir() else []:
        if d.is_dir() and not d.is_symlink() and (d / COMPLETE).is_file() and str(d) not in kept:
            shutil.rmtree(d)
            removed.append(str(d))
    return removed


class Progress:
    """Thread-safe byte counter with rate and ETA, written to an optional JSON file about once a second."""

    def __init__(self, total: int, out: Path | None = None, echo=None, max_rate: float | None = None):
        self.total, self.done, self.t0 = total, 0, time.monotonic()
        self.out, self.echo, self.lock, self.last = out, echo, threading.Lock(), 0.0
        self.max_rate = max_rate if max_rate and max_rate > 0 else None

    def add(self, n: int, force: bool = False):
        with self.lock:
            self.done += n
            now = time.monotonic()
            ahead = self.done / self.max_rate - (now - self.t0) if self.max_rate else 0.0
            report = force or now - self.last >= 1.0
            if report:
                self.last = now
                snap = self.snapshot()
        if ahead > 0:  # shared storage is shared: stay under the rate asked for (all copy threads together)
            time.sleep(min(ahead, 1.0))
        if not report:
            return
        if self.out:
            tmp = self.out.with_name(self.out.name + ".tmp")
            tmp.write_text(json.dumps(snap))
            os.replace(tmp, self.out)
        if self.echo:
            self.echo(snap)

    def snapshot(self) -> dict:
        el = max(time.monotonic() - self.t0, 1e-6)
        rate = self.done / el
        eta = (self.total - self.done) / rate if rate > 0 else None
        return {"bytes": self.done, "total": self.total, "rate_bps": rate, "eta_s": eta, "elapsed_s": el,
                "line": f"{self.done / 1e9:.2f}/{self.total / 1e9:.2f} GB, {rate / 1e9:.2f} GB/s, "
                        f"ETA {'?' if eta is None else f'{eta:.0f}s'}"}


def _copy_file(src: Path, dst: Path, prog: Progress, verify_hash: bool, chunk: int = CHUNK) -> str:
    """Copy one file, keeping zero chunks as holes, resuming after the last whole chunk already at ``dst``.
    Returns the source's sha256; with verify_hash the destination is read back from disk and must match."""
    size = src.stat().st_size
    h = hashlib.sha256()
    start = 0
    if dst.exists():
        start = min(dst.stat().st_size, size) // chunk * chunk
    dst.parent.mkdir(parents=True, exist_ok=True)
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(src, "rb", buffering=0) as fi, open(dst, "r+b" if dst.exists() else "wb", buffering=0) as fo:
        pos = 0
        while pos < start:  # the prefix already copied: hash the source's bytes again, do not copy them
            n = fi.readinto(view[:min(chunk, start - pos)])
            if not n:
                break
            h.update(view[:n])
            pos += n
        prog.add(start)
        fo.seek(start)
        while True:
            n = fi.readinto(buf)
            if not n:
                break
            part = view[:n]
            h.update(part)
            if part == _ZERO[:n]:
                fo.seek(n, os.SEEK_CUR)
            else:
                for b in range(0, n, HOLE):  # zero blocks stay holes, as with cp --sparse=always
                    blk = part[b:b + HOLE]
                    if blk == _ZERO[:len(blk)]:
                        fo.seek(len(blk), os.SEEK_CUR)
                    else:
                        fo.write(blk)
            prog.add(n)
        fo.truncate(size)
        os.fsync(fo.fileno())
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fo.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    digest = h.hexdigest()
    if verify_hash:
        got = _sha256(dst)
        if got != digest:
            dst.unlink()  # our own partial copy: the rerun starts this file again
            raise OSError(f"{dst}: read back sha256 {got[:16]}... differs from the source's {digest[:16]}...")
    return digest


def copy_tree(src: str | Path, dst: str | Path, jobs: int = 4, verify_hash: bool = True,
              progress_file: str | Path | None = None, echo=None, link_from: str | Path | None = None,
              max_rate: float | None = None) -> dict:
    """Copy ``src`` into ``dst`` (a directory specdeploy owns), ``jobs`` files at a time. A journal in ``dst``
    records each verified file, so a rerun after an interruption copies only what is missing. With
    ``link_from`` (the previous complete copy) unchanged files are hard-linked instead of copied. ``max_rate``
    (bytes per second, all jobs together) keeps the copy from saturating shared storage."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    jpath = dst / JOURNAL
    journal: dict = json.loads(jpath.read_text()) if jpath.is_file() else {}
    prev_journal: dict = {}
    if link_from and (Path(link_from) / COMPLETE).is_file():
        prev_journal = json.loads((Path(link_from) / COMPLETE).read_text()).get("files", {})
    files = listing(src)
    todo, linked, skipped = [], 0, 0
    for rel, size, mtime in files:
        d = dst / rel
        if journal.get(rel, [None])[:2] == [size, mtime] and d.is_file() and d.stat().st_size == size:
            skipped += 1
            continue
        if prev_journal.get(rel, [None])[:2] == [size, mtime] and link_from:
            d.parent.mkdir(parents=True, exist_ok=True)
            if d.exists():
                d.unlink()  # a partial copy inside our own staging directory
            os.link(Path(link_from) / rel, d)
            journal[rel] = prev_journal[rel]
            linked += 1
            continue
        todo.append((rel, size, mtime))
    total = sum(s for _, s, _ in todo)
    prog = Progress(total, Path(progress_file) if progress_file else None, echo, max_rate)
    lock = threading.Lock()

    def one(item):
        rel, size, mtime = item
        digest = _copy_file(src / rel, dst / rel, prog, verify_hash)
        st = (src / rel).stat()
        if [st.st_size, st.st_mtime_ns] != [size, mtime]:
            raise OSError(f"{src / rel} changed while it was copied; run the copy again")
        os.utime(dst / rel, ns=(st.st_atime_ns, st.st_mtime_ns))
        with lock:
            journal[rel] = [size, mtime, digest]
            tmp = jpath.with_name(JOURNAL + ".tmp")
            tmp.write_text(json.dumps(journal))
            os.replace(tmp, jpath)

    t0 = time.monotonic()
    with ThreadPoolExecutor(max(1, jobs)) as ex:
        for _ in ex.map(one, sorted(todo, key=lambda t: -t[1])):
            pass
    prog.add(0, force=True)
    tmp = jpath.with_name(JOURNAL + ".tmp")
    tmp.write_text(json.dumps(journal))
    os.replace(tmp, jpath)
    el = time.monotonic() - t0
    return {"files": len(files), "copied": len(todo), "linked": linked, "skipped": skipped, "bytes": total,
            "seconds": el, "gbps": total / el / 1e9 if el > 0 else None}


def stage(src: str | Path, link: str | Path, jobs: int = 4, verify_hash: bool = True,
          variable: str = "specdeploy_model_path", manifest: str | None = None, progress_file=None,
          echo=None, max_rate: float | None = None) -> dict:
    """Stage ``src`` beside ``link`` and flip ``link`` to it once it is complete and verified. Returns what was
    done; an unchanged source reads no weights."""
    src, link = Path(src), Path(link)
    cid = tree_id(src)
    store = store_of(link)
    final = store / cid
    if link.is_symlink() and Path(os.readlink(link)) == final and (final / COMPLETE).is_file():
        return {"changed": False, "id": cid, "target": str(final)}
    if link.exists() and not link.is_symlink() and link.is_dir() and any(link.iterdir()):
        raise SwitchError(f"{variable}: {link} is a directory with content, not a link specdeploy manages; its "
                          "files are left as they are. Fix: use specdeploy_model_source: host for weights already "
                          f"there, or move {link} aside yourself")
    previous = Path(os.readlink(link)) if link.is_symlink() else None
    if not (final / COMPLETE).is_file():
        partial = store / f"{cid}.partial"
        stats = copy_tree(src, partial, jobs, verify_hash, progress_file, echo,
                          link_from=previous if previous and previous.is_dir() else None, max_rate=max_rate)
        res = verify(partial, variable, manifest)
        if not res.ok:
            raise SwitchError("\n".join(p.line() for p in res.problems))
        journal = json.loads((partial / JOURNAL).read_text())
        (partial / COMPLETE).write_text(json.dumps({"id": cid, "source": str(src), "files": journal}))
        os.replace(partial, final)
    else:
        stats = {"copied": 0}
    prev = switch(link, final, variable)
    pruned = prune(link, keep=(prev,))
    return {"changed": True, "id": cid, "target": str(final), "previous": prev, "pruned": pruned, **stats}


def precheck(mode: str, path: str, kind: str = "model", shared: str | None = None) -> list[Problem]:
    """Host-side checks before any change on the host: the weights a mode reads are complete, and a mode that
    switches a link will not meet a directory of weights it did not create."""
    var = f"specdeploy_{kind}_path"
    if mode == "host":
        return verify(path, var).problems
    out: list[Problem] = []
    if mode == "shared":
        out += verify(shared or "", f"specdeploy_{kind}_shared_path").problems
    p = Path(path)
    if p.exists() and not p.is_symlink() and (not p.is_dir() or any(p.iterdir())):
        out.append(Problem(var, f"{p} already holds files and is not a link specdeploy manages; {mode} staging "
                           "switches a link there and never replaces weights", f"set specdeploy_{kind}_source: host "
                           f"to serve the weights already at {p}, or point {var} at a new path"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="staging.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    flag = {"action": "store_true"}
    var = {"default": "specdeploy_model_path"}
    # command -> (help, positionals, options)
    commands = {
        "verify": ("check a checkpoint (headers only; sha256 with --manifest)", ["dir"],
                   {"--variable": var, "--manifest": {}, "--stamp": {}, "--write-stamp": flag, "--json": flag}),
        "stage": ("verified, resumable copy beside LINK, then an atomic switch of LINK", ["src", "link"],
                  {"--jobs": {"type": int, "default": 4},
                   "--verify": {"choices": ["hash", "headers"], "default": "hash"}, "--variable": var,
                   "--manifest": {}, "--progress-file": {},
                   "--max-rate-mbps": {"type": float, "default": 0.0, "help": "read at most this many MB/s from the "
                                       "source, all jobs together (0: no limit)"}, "--json": flag}),
        "finish": ("verify STORE/ID.partial (copied by rsync), mark it complete, switch LINK", ["link", "id"],
                   {"--variable": var, "--manifest": {}}),
        "precheck": ("host-side checks before any change: the source and the target path", ["path"],
                     {"--kind": {"choices": ["model", "drafter"], "default": "model"}, "--shared": {}}),
        "switch": ("point LINK at TARGET with one rename", ["link", "target"], {"--variable": var}),
        "id": ("content id of a directory (names, sizes, mtimes)", ["dir"], {}),
    }
    for name, (text, positionals, options) in commands.items():
        cmd = sub.add_parser(name, help=text)
        if name == "precheck":
            cmd.add_argument("mode", choices=["host", "controller", "shared"])
        for arg in positionals:
            cmd.add_argument(arg)
        for opt, kw in options.items():
            cmd.add_argument(opt, **kw)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "verify":
            res = verify(a.dir, a.variable, a.manifest, a.stamp, a.write_stamp)
            if a.json:
                print(json.dumps(res.to_dict()))
            else:
                for p in res.problems:
                    print(p.line())
                if res.ok:
                    print(f"ok: {res.files} weight files, {res.bytes / 1e9:.2f} GB, {res.hashed} hashed")
            return 0 if res.ok else 1
        if a.cmd == "stage":
            echo = None if a.json else (lambda snap: print(snap["line"], file=sys.stderr, flush=True))
            out = stage(a.src, a.link, a.jobs, a.verify == "hash", a.variable, a.manifest, a.progress_file, echo,
                        max_rate=a.max_rate_mbps * 1e6)
            print(json.dumps(out) if a.json else f"{a.link} -> {out['target']} "
                  f"({'unchanged' if not out['changed'] else 'staged'})")
            return 0
        if a.cmd == "precheck":
            problems = precheck(a.mode, a.path, a.kind, a.shared)
            for p in problems:
                print(p.line())
            return 1 if problems else 0
        if a.cmd == "finish":
            return _finish(a.link, a.id, a.variable, a.manifest)
        if a.cmd == "switch":
            prev = switch(a.link, a.target, a.variable)
            print(json.dumps({"changed": prev != a.target, "previous": prev, "target": a.target}))
            return 0
        if a.cmd == "id":
            print(tree_id(a.dir))
            return 0
    except (SwitchError, OSError) as exc:
        print(f"ERROR {exc}", file=sys.stderr)
        return 1
    return 2


def _finish(link: str, cid: str, variable: str, manifest: str | None) -> int:
    store = store_of(link)
    final, partial = store / cid, store / f"{cid}.partial"
    if not (final / COMPLETE).is_file():
        res = verify(partial, variable, manifest)
        if not res.ok:
            for p in res.problems:
                print(p.line(), file=sys.stderr)
            return 1
        (partial / COMPLETE).write_text(json.dumps({"id": cid, "files": {
            rel: [size, mtime] for rel, size, mtime in listing(partial)}}))
        os.replace(partial, final)
    prev = switch(link, final, variable)
    pruned = prune(link, keep=(prev,)) if prev != str(final) else []
    print(json.dumps({"changed": prev != str(final), "id": cid, "target": str(final), "previous": prev,
                      "pruned": pruned}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
