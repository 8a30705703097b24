"""The controller's side of a copy to a host: one rsync at a time per destination, its progress in a log the
deploy front door reads, and a copy an interrupted run left going stopped first (Ansible's workers outlive a
stopped ansible-playbook). The common role runs it as ``python -m specdeploy.ops.copy --log LOG -- rsync ARGS``.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def controller_log(host: str, kind: str) -> Path:
    """Where a `controller` copy's rsync progress is written on the controller, for the deploy front door: a
    directory of the user's own (the record of the running copy sits beside the log, and decides what a later
    copy stops)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdeploy" / "stage"
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host)
    return base / f"{safe}-{kind}.log"


_UNITS = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def rsync_progress(text: str) -> dict | None:
    """The last ``--info=progress2`` line of an rsync log as {bytes, percent, rate_bps, eta_s, line}; None when
    the log holds no progress line yet."""
    import re
    last = None
    for m in re.finditer(r"([\d,]+)\s+(\d{1,3})%\s+([\d.]+)([kKMGT]?B)/s\s+(\d+):(\d\d):(\d\d)", text):
        last = m
    if not last:
        return None
    done, pct = int(last.group(1).replace(",", "")), int(last.group(2))
    rate = float(last.group(3)) * _UNITS.get(last.group(4), 1)
    eta = int(last.group(5)) * 3600 + int(last.group(6)) * 60 + int(last.group(7))
    total = done * 100 / pct if pct else None
    line = (f"{done / 1e9:.2f}" + (f"/{total / 1e9:.2f}" if total else "") + f" GB, {rate / 1e9:.2f} GB/s, "
            f"ETA {eta}s")
    return {"bytes": done, "percent": pct, "rate_bps": rate, "eta_s": eta, "line": line}


def _start_time(pid: int) -> str | None:
    """Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat); None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _stop_left_over(pidfile: Path, dest: str, grace_s: float = 10.0) -> int | None:
    """Stop the copy recorded in ``pidfile`` when that very process (same pid and start time, a record of this
    user's, the same destination) still runs: a play that is stopped leaves its copy running, because Ansible's
    workers run in sessions of their own. Returns the pid that was stopped."""
    import signal
    try:
        if pidfile.stat().st_uid != os.getuid():
            return None
        rec = json.loads(pidfile.read_text())
        pid, started = int(rec["pid"]), str(rec["start"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if pid <= 1 or rec.get("dest") != dest or _start_time(pid) != started:
        return None  # another copy's record, or finished long ago (the pid may name another process now)
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return pid
        except PermissionError:
            return None
        end = time.monotonic() + wait
        while time.monotonic() < end:
            if _start_time(pid) != started:
                return pid
            time.sleep(0.1)
    return pid


def controller_copy(argv: list[str], log: str | Path, keep_lines: int = 60) -> int:
    """Run one controller-to-host copy (``argv``, rsync; its last argument the destination) with its output in
    ``log``, which the deploy front door reads for progress. One copy per destination at a time: a copy that an
    interrupted run left going is stopped first, and this one resumes from what it wrote. Prints the output
    without progress lines (errors, --stats) and returns the copy's exit code."""
    import re
    import signal
    import subprocess
    log = Path(log)
    pidfile = log.with_name(log.name + ".pid")
    stopped = _stop_left_over(pidfile, argv[-1])
    if stopped:
        print(f"stopped the copy (pid {stopped}) that an interrupted run left going; this one resumes it")
    proc = None
    stopping = []

    def _forward(signum, _frame):  # stopping this wrapper stops the copy
        stopping.append(signum)
        if proc is not None:
            proc.terminate()

    old = {s: signal.signal(s, _forward) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        with log.open("wb") as f:
            try:
                proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            except OSError as exc:
                print(f"ERROR {argv[0]}: {exc}", file=sys.stderr)
                return 127
        if stopping:
            proc.terminate()
        tmp = pidfile.with_name(pidfile.name + ".tmp")
        tmp.write_text(json.dumps({"pid": proc.pid, "start": _start_time(proc.pid), "dest": argv[-1]}))
        os.replace(tmp, pidfile)
        rc = proc.wait()
    finally:
        if proc is not None and proc.poll() is None:  # this wrapper failed: never leave the copy unrecorded
            proc.terminate()
            proc.wait()
        for sig, handler in old.items():
            signal.signal(sig, handler)
        try:
            if proc is not None and json.loads(pidfile.read_text()).get("pid") == proc.pid:  # not a newer run's
                pidfile.unlink()
        except (OSError, ValueError, AttributeError):
            pass
    text = log.read_bytes().decode("utf-8", "replace").replace("\r", "\n")
    lines = [ln for ln in text.splitlines() if ln.strip() and not re.search(r"\d+%.*/s", ln)]
    print("\n".join(lines[-keep_lines:]))
    return rc


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m specdeploy.ops.copy", description=__doc__.splitlines()[0])
    ap.add_argument("--log", required=True)
    ap.add_argument("argv", nargs=argparse.REMAINDER, help="-- rsync ARGS...")
    a = ap.parse_args(argv)
    cmd = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
    if not cmd:
        print("ERROR copy: no command given. Fix: python -m specdeploy.ops.copy --log LOG -- rsync ARGS...",
              file=sys.stderr)
        return 2
    try:
        return controller_copy(cmd, a.log)
    except OSError as exc:
        print(f"ERROR {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
