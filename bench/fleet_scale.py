"""The controller's cost at a fleet's size (docs/fleet.md): for each size, a simulated fleet
(specdeploy.testing.fleetsim) and, side by side in one run, `ansible-inventory --list` (the baseline of the
inventory commands), `specdeploy preflight`, `specdeploy plan --out`, `specdeploy status` against every host's
simulated exporter, a bare `ansible -m ping` over the simulated connection (the baseline of the playbook), and,
at the sizes in --deploy-sizes, a first deploy and a no-op redeploy through `ansible-playbook ansible/deploy.yml`.
Each command's wall time (median of --runs) and time per host; the growth exponent fitted (log-log least squares)
over the sizes from 64 hosts on; a JSON record and a PNG chart beside it.

The deploys run after the commands, each on a fresh fleet, in a bracketed order: up the sizes and back down
(64, 256, 64), so that every size's runs centre on one moment and a machine whose speed drifts in a straight line
during the run (a 64-host deploy here moved by a third within two hours) moves every size alike; a size's figures
are the mean of its runs, and the record keeps each run (a size's runs differ by the drift).

    nice -n 10 python3 bench/fleet_scale.py --sizes 8,64,256,1024 --deploy-sizes 8,64 --out bench/fleet_scale

Nothing outside the temporary directory is written; no host is reached (loopback addresses, the test-only
connection plugin)."""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from specdeploy.testing import fleetsim  # noqa: E402

SIZE_MAX = 4096
FIT_FROM = 64


def sizes_arg(text: str) -> list[int]:
    try:
        out = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give sizes as integers separated by commas, e.g. 8,64,256")
    if not out or out[0] < 1 or out[-1] > SIZE_MAX:
        raise argparse.ArgumentTypeError(f"{text!r}: sizes from 1 to {SIZE_MAX}")
    return out


def timed(argv: list[str], env: dict, timeout: float) -> tuple[float, int, str, str]:
    t0 = time.monotonic()
    p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, errors="replace")
    return time.monotonic() - t0, p.returncode, p.stdout, (p.stdout + p.stderr)[-2000:]


def fit(points: dict[int, float], start: int = FIT_FROM) -> float | None:
    """The exponent b of t = a * n^b over the sizes from ``start`` on (None with fewer than two)."""
    xs = [(math.log(n), math.log(t)) for n, t in sorted(points.items()) if n >= start and t > 0]
    if len(xs) < 2:
        return None
    mx, my = statistics.fmean(x for x, _ in xs), statistics.fmean(y for _, y in xs)
    den = sum((x - mx) ** 2 for x, _ in xs)
    return sum((x - mx) * (y - my) for x, y in xs) / den if den else None


def one_size(n: int, base: Path, runs: int, timeout: float) -> dict:
    inv, state = base / f"n{n}" / "inv", base / f"n{n}" / "state"
    cli = [sys.executable, "-m", "specdeploy.cli"]
    # specdeploy's commands and ansible-inventory run as an operator runs them: without the simulator's connection
    # plugin path (a connection setting leaves the native reader in use, hostvars.ansible_settings; the commands
    # are measured without it all the same)
    env = {k: v for k, v in fleetsim.environment(state).items() if k != "ANSIBLE_CONNECTION_PLUGINS"}
    out: dict = {"hosts": n, "runs": runs, "errors": {}}
    samples: dict[str, list[float]] = {}
    with fleetsim.Exporters() as ex:
        fleetsim.write_inventory(inv, state, n, extra_group_vars={"specdeploy_exporter_port": ex.port})
        commands = {
            "ansible-inventory --list": [fleetsim._tool("ansible-inventory"), "-i", str(inv), "--list"],
            "preflight": cli + ["preflight", "-i", str(inv)],
            "plan --out": None,
            "status": cli + ["status", "-i", str(inv), "--json", "--timeout", "2", "--prometheus",
                             "http://127.0.0.1:9"],
        }
        for r in range(runs):  # interleaved: each round runs every command once, so load drifts hit all alike
            for name, argv in commands.items():
                if name == "plan --out":
                    target = base / f"n{n}" / f"plan-{r}"
                    argv = cli + ["plan", "-i", str(inv), "--out", str(target)]
                wall, rc, stdout, tail = timed(argv, env, timeout)
                ok = rc == 0 or (name == "status" and rc == 1)  # status exits 1: Prometheus is not there
                if name == "status" and ok:
                    try:
                        rows = json.loads(stdout)["hosts"]
                    except (ValueError, KeyError):
                        rows = []
                    out["status_up"] = sum(1 for h in rows if h.get("up"))
                    out["status_answered"] = len(rows)
                    out["status_peak_in_flight"] = ex.peak
                    ok = len(rows) == n
                if not ok:
                    out["errors"][name] = tail
                samples.setdefault(name, []).append(wall)
        ping = [fleetsim.ping(inv, state, forks=50, timeout=timeout) for _ in range(runs)]
    samples["ansible -m ping"] = [p.wall_s for p in ping]
    out["ping_cpu_s"] = statistics.median(p.cpu_s for p in ping)
    if any(p.rc or len(p.recap) != n for p in ping):
        out["errors"]["ansible -m ping"] = ping[-1].output[-2000:]
    out["wall_s"] = {k: statistics.median(v) for k, v in samples.items()}
    out["spread_s"] = {k: [min(v), max(v)] for k, v in samples.items()}
    shutil.rmtree(base / f"n{n}", ignore_errors=True)
    return out


def bracketed(sizes: list[int]) -> list[int]:
    """Up the sizes and back down (8, 64, 256 -> 8, 64, 256, 64, 8): every size's runs centre on the same moment."""
    s = sorted(set(sizes))
    return s + s[-2::-1]


def one_deploy(n: int, base: Path, i: int, timeout: float) -> dict:
    """A first deploy of a fresh fleet of ``n`` hosts and its no-op redeploy."""
    inv, state = base / f"d{i}-n{n}" / "inv", base / f"d{i}-n{n}" / "state"
    fleetsim.write_inventory(inv, state, n)
    started = time.strftime("%H:%M:%S", time.gmtime())
    first = fleetsim.playbook(inv, state, timeout=timeout)
    again = fleetsim.playbook(inv, state, timeout=timeout)
    shutil.rmtree(base / f"d{i}-n{n}", ignore_errors=True)
    engines = fleetsim.host_names(n)  # the recap also names the monitoring host

    def figures(run) -> dict:
        return {"rc": run.rc, "wall_s": run.wall_s, "cpu_s": run.cpu_s, "changed": run.changed,
                "failed_hosts": run.failed_hosts, "hosts_in_recap": sum(h in run.recap for h in engines)}
    return {"hosts": n, "started": started, "first": figures(first), "noop": figures(again)}


def deploy_summary(runs: list[dict]) -> dict:
    """Per size: the mean of its runs (wall and CPU seconds, and per host), every run's figures, changed and rc."""
    out = {}
    for n in sorted({r["hosts"] for r in runs}):
        mine = [r for r in runs if r["hosts"] == n]
        out[n] = {}
        for key in ("first", "noop"):
            wall = statistics.fmean(r[key]["wall_s"] for r in mine)
            cpu = statistics.fmean(r[key]["cpu_s"] for r in mine)
            out[n][key] = {"wall_s": wall, "cpu_s": cpu, "cpu_s_per_host": cpu / n,
                           "runs_wall_s": [r[key]["wall_s"] for r in mine],
                           "runs_cpu_s": [r[key]["cpu_s"] for r in mine],
                           "changed": [r[key]["changed"] for r in mine], "rc": [r[key]["rc"] for r in mine],
                           "failed_hosts": sorted({h for r in mine for h in r[key]["failed_hosts"]}),
                           "hosts_in_recap": [r[key]["hosts_in_recap"] for r in mine]}
    return out


def deploy_errors(summary: dict) -> list[str]:
    """What makes the deploy phase a failure: a run that did not pass, an engine host missing from a recap, a
    no-op redeploy that changed something."""
    errs = []
    for n, d in summary.items():
        for key in ("first", "noop"):
            if any(d[key]["rc"]) or any(h != n for h in d[key]["hosts_in_recap"]):
                errs.append(f"{n} hosts, {key} deploy: rc {d[key]['rc']}, hosts in recap {d[key]['hosts_in_recap']}")
        if any(d["noop"]["changed"]):
            errs.append(f"{n} hosts: the no-op redeploy changed {d['noop']['changed']}")
    return errs


def chart(record: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    names = sorted({k for r in record["sizes"] for k in r["wall_s"]} | {"deploy (first)", "deploy (no-op)"})
    for name in names:
        pts = [(r["hosts"], r["wall_s"].get(name)) for r in record["sizes"]]
        if name.startswith("deploy"):
            key = "first" if "first" in name else "noop"
            pts = [(int(n), d[key]["wall_s"]) for n, d in record.get("deploy", {}).items()]
        pts = [(n, t / n) for n, t in pts if t]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("hosts")
    ax.set_ylabel("controller wall time per host (s)")
    ax.set_title("specdeploy at a fleet's size (simulated fleet; deploys bracketed)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=sizes_arg, default=[8, 64, 256, 1024])
    ap.add_argument("--deploy-sizes", type=sizes_arg, default=None,
                    help="sizes at which a first and a no-op deploy also run (default: every size)")
    ap.add_argument("--runs", type=int, default=3, choices=range(1, 11), metavar="1..10")
    ap.add_argument("--timeout", type=float, default=3600.0, help="per command, seconds")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "fleet_scale",
                    help="writes OUT.json and OUT.png")
    a = ap.parse_args(argv)
    deploy_sizes = set(a.sizes if a.deploy_sizes is None else a.deploy_sizes)
    record = {"machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg()}, "sizes": [],
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    runs = []
    with tempfile.TemporaryDirectory(prefix="fleet-scale-") as tmp:
        for n in a.sizes:
            r = one_size(n, Path(tmp), a.runs, a.timeout)
            r["load_after"] = os.getloadavg()
            record["sizes"].append(r)
            w = r["wall_s"]
            print(f"{n:5d} hosts: " + ", ".join(f"{k} {v:.2f} s" for k, v in w.items())
                  + (f"; ERRORS in {sorted(r['errors'])}" if r["errors"] else ""), flush=True)
        order = bracketed([n for n in a.sizes if n in deploy_sizes])
        for i, n in enumerate(order):
            d = one_deploy(n, Path(tmp), i, a.timeout)
            runs.append(d)
            first, noop = d["first"], d["noop"]
            print(f"deploy {i + 1}/{len(order)}, {n} hosts (from {d['started']} UTC): first {first['wall_s']:.1f} s "
                  f"({first['cpu_s'] / n:.2f} CPU-s per host, rc {first['rc']}), no-op {noop['wall_s']:.1f} s "
                  f"changed={noop['changed']}", flush=True)
    record["deploy_order"] = [r["hosts"] for r in runs]
    record["deploy_runs"] = runs
    record["deploy"] = deploy_summary(runs)
    names = record["sizes"][0]["wall_s"].keys()
    record["exponent"] = {k: fit({r["hosts"]: r["wall_s"][k] for r in record["sizes"]}) for k in names}
    for key in ("first", "noop"):
        record["exponent"][f"deploy {key}"] = fit({n: d[key]["wall_s"] for n, d in record["deploy"].items()})
        record["exponent"][f"deploy {key} CPU"] = fit({n: d[key]["cpu_s"] for n, d in record["deploy"].items()})
    errors = deploy_errors(record["deploy"])
    record["deploy_errors"] = errors
    big = record["sizes"][-1]["wall_s"]
    base = big["ansible-inventory --list"]
    record["ratio_at_largest"] = {k: v / base for k, v in big.items()}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{a.out}.json").write_text(json.dumps(record, indent=2))
    chart(record, Path(f"{a.out}.png"))
    print("exponent (64 hosts on):", json.dumps(record["exponent"]))
    print("x ansible-inventory at the largest size:", json.dumps({k: round(v, 2) for k, v in
                                                                 record["ratio_at_largest"].items()}))
    for e in errors:
        print("ERROR:", e)
    return 0 if not any(r["errors"] for r in record["sizes"]) and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
