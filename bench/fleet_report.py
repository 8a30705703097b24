"""The fleet's view at a fleet's size (docs/fleet.md): a real Prometheus scrapes N simulated hosts in serving groups
(the scrape config, its group labels and the rules rendered by specdeploy from a simulated inventory, exactly as the
monitoring role renders them), with a second release rolled out to part of the fleet and a few engines down. Then,
side by side in one run:

- every dashboard panel's query (the fleet row and the per-host panels), timed at "All" and drilled down to one
  serving group, with the number of series each returns (what a Grafana panel has to draw);
- ``specdeploy report`` per release, per serving group and drilled down to one group, timed, with its PNG.

    python3 bench/fleet_report.py --hosts 1024 --group-size 2 --out bench/fleet_report

Writes OUT.json and OUT-by-release.png, OUT-by-group.png, OUT-one-group.png. Only loopback addresses are served
and scraped; nothing outside the temporary directory is written."""
from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from specdeploy.testing import fleetsim  # noqa: E402


class Fleet:
    """What each simulated host's exporter and engine answer: release r2 on the first ``rolled`` share of the
    hosts, acceptance spread per host (r2 a little better), every 50th engine down, tokens counting up."""

    def __init__(self, n: int, rolled: float):
        self.n, self.rolled, self.t0 = n, rolled, time.time()

    def release(self, i: int) -> str:
        return "r2" if i < self.n * self.rolled else "r1"

    def exporter(self, addr: str) -> str:
        i = fleetsim.index(addr)
        up = 0.0 if i % 50 == 7 else 1.0
        al = 2.1 + 0.8 * ((i * 0.618) % 1.0) + (0.3 if self.release(i) == "r2" else 0.0)
        lines = ["# TYPE specdeploy_engine_up gauge", f"specdeploy_engine_up {up}",
                 "# TYPE specdeploy_engine_info gauge",
                 f'specdeploy_engine_info{{engine="vllm",version="0.32.0",release="{self.release(i)}",'
                 f'spec_tokens="3"}} 1.0',
                 "# TYPE specdeploy_gate_speedup gauge",
                 "# TYPE specdeploy_gate_step_ratio gauge"]
        if up:
            lines += ["# TYPE specdeploy_spec_acceptance_length gauge", f"specdeploy_spec_acceptance_length {al:.3f}"]
        for c, s in (("1", al / 1.55), ("8", al / 1.9)):
            lines += [f'specdeploy_gate_speedup{{concurrency="{c}"}} {s:.3f}',
                      f'specdeploy_gate_step_ratio{{concurrency="{c}"}} {1.55 if c == "1" else 1.9}']
        return "\n".join(lines) + "\n"

    def engine(self, addr: str) -> str:
        i = fleetsim.index(addr)
        if i % 50 == 7:
            return "garbage\x00"
        tokens = (time.time() - self.t0) * (20 + i % 7)
        return ("# TYPE vllm:generation_tokens_total counter\n"
                f'vllm:generation_tokens_total{{model_name="kimi"}} {tokens:.1f}\n'
                "# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{model_name="kimi"}} {4 + i % 3}\n')


def query(base: str, q: str) -> tuple[float, int]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    t0 = time.monotonic()
    data = json.load(urllib.request.urlopen(url, timeout=60))
    return time.monotonic() - t0, len(data["data"]["result"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=1024)
    ap.add_argument("--group-size", type=int, default=2)
    ap.add_argument("--rolled", type=float, default=0.4, help="share of the hosts on the second release")
    ap.add_argument("--scrape", default="5s")
    ap.add_argument("--warm", type=float, default=60.0, help="seconds of scrapes before measuring")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "fleet_report")
    a = ap.parse_args(argv)
    if not shutil.which("prometheus"):
        print("needs Prometheus (scripts/setup.sh installs Debian's package)", file=sys.stderr)
        return 2
    from specdeploy.deploy.groups import specdeploy_targets
    from specdeploy.hostvars import inventory as inv_mod
    from specdeploy.plan.render.prometheus import render_prometheus
    from specdeploy.speculation import report
    from specdeploy.speculation.monitoring import VARIABLES, panel_queries, render_rules
    fleet = Fleet(a.hosts, a.rolled)
    record: dict = {"hosts": a.hosts, "group_size": a.group_size, "rolled": a.rolled, "scrape": a.scrape,
                    "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with tempfile.TemporaryDirectory(prefix="fleet-report-") as tmp, \
            fleetsim.Exporters(page=fleet.exporter) as exp, fleetsim.Exporters(page=fleet.engine) as eng:
        tmp = Path(tmp)
        inv = fleetsim.write_inventory(tmp / "inv", tmp / "state", a.hosts, group_size=a.group_size)
        loaded = inv_mod.load(str(inv))
        targets = specdeploy_targets(loaded.all_vars, [h.name for h in loaded.engine_hosts])
        for t in targets:  # every host's exporter and engine on the simulators' ports; node and DCGM absent
            t.update(exporter_port=exp.port, engine_port=eng.port, node_port=9, dcgm_port=9)
        groups = sorted({t["group"] for t in targets})
        record["serving_hosts"] = sum(1 for t in targets if t["serves"])
        record["groups"] = len(groups)
        rules = tmp / "rules.yml"
        rules.write_text(render_rules(eval_interval=a.scrape))
        cfg = tmp / "prometheus.yml"
        cfg.write_text(render_prometheus(targets, [str(rules)], scrape_interval=a.scrape))
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        prom = subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + 60
            while time.time() < deadline:
                try:
                    urllib.request.urlopen(f"{base}/-/ready", timeout=2).read()
                    break
                except OSError:
                    time.sleep(0.5)
            print(f"{a.hosts} hosts in {len(groups)} serving groups ({record['serving_hosts']} serve): scraping "
                  f"for {a.warm:.0f} s", flush=True)
            time.sleep(a.warm)
            one = groups[len(groups) // 2]
            views = {"all": panel_queries("1m"), "one group": panel_queries("1m", group=one)}
            panels: list = []
            for (title, q_all), (_, q_one) in zip(views["all"], views["one group"]):
                row = {"title": title}
                for view, q in (("all", q_all), ("one group", q_one)):
                    times, n = [], 0
                    for _ in range(a.runs):
                        t, n = query(base, q)
                        times.append(t)
                    row[view] = {"median_s": statistics.median(times), "series": n}
                panels.append(row)
            record["panels"] = panels
            record["report"] = {}
            for name, kw in (("by-release", {"by": "release"}), ("by-group", {"by": "group"}),
                             ("one-group", {"select": {"group": [one]}})):
                png = Path(f"{a.out}-{name}.png")
                png.parent.mkdir(parents=True, exist_ok=True)
                if png.exists():
                    png.unlink()
                t0 = time.monotonic()
                res = report.render(base, png, 600, **kw)
                record["report"][name] = {"wall_s": time.monotonic() - t0, "by": res["by"], "hosts": res["hosts"],
                                          "lines": {k: len(v) for k, v in res["last"].items()},
                                          "acceptance_last": {k: round(v, 3) for k, v in
                                                              list(res["last"]["acceptance"].items())[:4]}}
                print(f"report {name}: {record['report'][name]['wall_s']:.2f} s, {res['hosts']} hosts, one line per "
                      f"{res['by']}: {record['report'][name]['lines']}", flush=True)
        finally:
            prom.terminate()
            prom.wait(timeout=30)
    slow = sorted(record["panels"], key=lambda p: -p["all"]["median_s"])[:5]
    for p in slow:
        print(f"{p['all']['median_s'] * 1000:7.1f} ms, {p['all']['series']:5d} series (one group: "
              f"{p['one group']['series']}): {p['title']}")
    record["variables"] = list(VARIABLES)
    Path(f"{a.out}.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {a.out}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
