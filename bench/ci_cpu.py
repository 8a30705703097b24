"""Where a CI run's CPU goes, per test: the suite keeps both cores busy, so its time is its CPU, and a test's wall
time under three workers says little about what it costs (bench/README.md, "Where the suite's CPU goes").

    python3 bench/ci_cpu.py sample SAMPLES.jsonl [--every 3] &      # until killed
    PYTHONPATH=bench/ci_cpu SPECDEPLOY_CI_CPU_TIMES=TIMES.jsonl PYTEST_ADDOPTS="-p ci_cpu_plugin" bash .ci/run
    python3 bench/ci_cpu.py report SAMPLES.jsonl TIMES.jsonl [--top 40] [--json OUT]

``sample`` reads /proc every few seconds: the machine's busy time, and the CPU (own and reaped children, in clock
ticks) of the process tree under each pytest-xdist worker and under each sandbox host's ``systemd-nspawn``, and per
host by the service each process descends from (sshd carries every Ansible module run and every test's ssh).
``report`` charges each test with what its worker's tree gained in its window and, for a sandbox test, what its
fleet's hosts gained (hosts keep running between a fleet's tests: their idle cost lands on the next test).

Limits: a process reaped outside its tree (an orphan) loses its last ticks; a fleet torn down at a module's end moves
its hosts' ticks into the worker's (a negative host figure on that test, the total unchanged); a sample takes a few
tens of milliseconds of CPU itself.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import sys
import time
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
WORKER_MARK = b"exec(eval(sys.stdin.readline()))"  # how pytest-xdist starts its workers


def _procs() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, ticks of itself and its reaped children, comm)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            s = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        r = s.rfind(")")
        f = s[r + 2:].split()
        out[int(d)] = (int(f[1]), sum(int(x) for x in f[11:15]), s[s.find("(") + 1:r])
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def snapshot() -> dict:
    procs = _procs()
    roots = {}
    for pid, (_, _, comm) in procs.items():
        if comm == "systemd-nspawn":
            merged = [a for a in _cmdline(pid).split(b"\0") if a.endswith(b"/merged")]
            roots[pid] = "host:" + (merged[0].decode().rsplit("/", 2)[-2] if merged else str(pid))
        elif comm.startswith("python") and WORKER_MARK in _cmdline(pid):
            roots[pid] = f"gw{pid}"
    inits = {pid: roots[ppid] for pid, (ppid, _, _) in procs.items() if roots.get(ppid, "").startswith("host:")}
    trees: dict[str, int] = collections.Counter()
    services: dict[str, int] = collections.Counter()
    for pid, (_, ticks, _) in procs.items():
        chain, p = [pid], pid
        while p in procs and p not in roots and p not in inits and len(chain) < 200:
            p = procs[p][0]
            chain.append(p)
        if p in inits:  # inside a host: its tree, and the service below the host's init
            trees[inits[p]] += ticks
            svc = chain[-2] if len(chain) > 1 else None
            services[f"{inits[p][5:]}|{procs[svc][2] if svc in procs else 'init'}"] += ticks
        elif p in roots:
            trees[roots[p]] += ticks
    stat = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return {"t": time.time(), "busy": sum(stat) - stat[3] - stat[4], "trees": trees, "services": services}


def sample(out: Path, every: float) -> None:
    with open(out, "a", buffering=1) as fh:
        while True:
            fh.write(json.dumps(snapshot()) + "\n")
            time.sleep(every)


def _load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def report(samples: list[dict], tests: list[dict], top: int) -> dict:
    ts = [s["t"] for s in samples]

    def at(t: float) -> dict:
        return samples[max(0, min(len(samples) - 1, bisect.bisect_left(ts, t)))]

    def host_fleet(name: str) -> str:  # tests/helpers.py: fleet a from sdhost1, fleet b from sdhost5
        return "b" if int(name.rsplit("sdhost", 1)[-1] or 0) >= 5 else "a"

    rows = []
    for x in tests:
        a, b = at(x["t0"]), at(x["t1"])
        w = f"gw{x['pid']}"
        worker = (b["trees"].get(w, 0) - a["trees"].get(w, 0)) if w in a["trees"] and w in b["trees"] else 0
        group = x["id"].rsplit("@", 1)[1] if "@" in x["id"] else ""
        fleet = "b" if group == "sandbox-b" else "a" if group == "sandbox" else None
        hosts = 0
        if fleet:
            for k in set(a["trees"]) | set(b["trees"]):
                if k.startswith("host:") and host_fleet(k[5:]) == fleet:
                    hosts += b["trees"].get(k, 0) - a["trees"].get(k, 0)
        rows.append({"id": x["id"], "group": group or "rest", "cpu_s": (worker + hosts) / HZ,
                     "worker_s": worker / HZ, "hosts_s": hosts / HZ, "wall_s": x["t1"] - x["t0"]})
    rows.sort(key=lambda r: -r["cpu_s"])
    groups = collections.Counter()
    for r in rows:
        groups[r["group"]] += r["cpu_s"]
    services = collections.Counter()
    for a, b in zip(samples, samples[1:]):
        for k, v in b["services"].items():
            d = v - a["services"].get(k, v)
            if d > 0:  # a service that restarted starts again from 0: its drop is not counted
                services[k.split("|", 1)[1]] += d
    span = samples[-1]["t"] - samples[0]["t"]
    return {"span_s": span, "busy_s": (samples[-1]["busy"] - samples[0]["busy"]) / HZ,
            "tests_s": sum(r["cpu_s"] for r in rows), "groups_s": dict(groups.most_common()),
            "host_services_s": {k: v / HZ for k, v in services.most_common(20)}, "tests": rows[:top]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("out", type=Path)
    s.add_argument("--every", type=float, default=3.0)
    r = sub.add_parser("report")
    r.add_argument("samples", type=Path)
    r.add_argument("times", type=Path)
    r.add_argument("--top", type=int, default=40)
    r.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.cmd == "sample":
        sample(a.out, a.every)
        return 0
    for p in (a.samples, a.times):
        if not p.is_file():
            print(f"ci_cpu: {p}: no such file (give the sampler's output and the plugin's)", file=sys.stderr)
            return 2
    rep = report(_load(a.samples), _load(a.times), a.top)
    print(f"machine busy {rep['busy_s']:.0f} CPU-s over {rep['span_s']:.0f} s; charged to tests {rep['tests_s']:.0f}")
    print("by group: " + ", ".join(f"{k} {v:.0f}" for k, v in rep["groups_s"].items()))
    print("sandbox hosts by service: " + ", ".join(f"{k} {v:.0f}" for k, v in rep["host_services_s"].items()))
    for t in rep["tests"]:
        print(f"{t['cpu_s']:7.1f} CPU-s ({t['worker_s']:6.1f} worker, {t['hosts_s']:6.1f} hosts) "
              f"{t['wall_s']:6.1f} s  {t['id']}")
    if a.json:
        a.json.write_text(json.dumps(rep, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
