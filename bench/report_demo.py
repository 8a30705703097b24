"""Produce docs/report.png the way an operator would: `specdeploy report` against a real Prometheus that scraped
two engines (vLLM and SGLang simulators) and their exporters under a changing load for a few minutes.

    python3 bench/report_demo.py [--seconds 240] [--out docs/report.png]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from helpers import free_port, load, start_exporter, start_sim, stop, wait_http  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=240)
    ap.add_argument("--out", default=str(REPO / "docs/report.png"))
    a = ap.parse_args()
    from specdeploy.plan.render.prometheus import render_prometheus
    tmp = Path(tempfile.mkdtemp())
    procs, targets = [], []
    hosts = {"gpu-a": ("vllm", "127.0.0.5", "0.75", 1.9), "gpu-b": ("sglang", "127.0.0.6", "0.6", 1.4)}
    try:
        for host, (engine, addr, alpha, speedup) in hosts.items():
            ep, xp = free_port(addr), free_port(addr)
            gate = tmp / f"{host}.json"
            gate.write_text(json.dumps({"verdict": "keep", "timestamp": time.time(), "levels": [
                {"concurrency": 8, "speedup": speedup, "requests": 32, "errors": 0}]}))
            procs.append(start_sim(engine, addr, ep, {"SPECDEPLOY_SIM_ACCEPTANCE": alpha,
                                                      "SPECDEPLOY_SIM_STEP_MS": "8"}))
            procs.append(start_exporter(engine, f"http://{addr}:{ep}", addr, xp, window=30, gate_file=gate,
                                        info=("spec_tokens=3",)))
            targets.append({"host": host, "address": addr, "engine": engine, "engine_port": ep, "exporter_port": xp})
        cfg = tmp / "prometheus.yml"
        cfg.write_text(render_prometheus(targets, [], scrape_interval="2s"))
        port = free_port()
        procs.append(subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                                       f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        wait_http(f"http://127.0.0.1:{port}/-/ready", timeout=30)
        t_end = time.time() + a.seconds

        def client(t, start_at):
            while time.time() < start_at:
                time.sleep(0.5)
            while time.time() < t_end:
                load(f"http://{t['address']}:{t['engine_port']}", n=1, max_tokens=64)
        threads = [threading.Thread(target=client, args=(t, time.time() + i * a.seconds / 8), daemon=True)
                   for t in targets for i in range(4)]  # concurrency ramps 1 -> 4 per host
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "report", "--prometheus",
                            f"http://127.0.0.1:{port}", "--range", f"{a.seconds // 60 + 1}m", "--nccl",
                            str(REPO / "bench/nccl-h200x2/nvlink.json"), "--out", a.out, "--json"],
                           capture_output=True, text=True)
        print(r.stdout or r.stderr)
    finally:
        stop(*procs)


if __name__ == "__main__":
    main()
