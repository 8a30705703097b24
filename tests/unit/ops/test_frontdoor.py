"""The front door without sandbox hosts: load progress from engine log lines, ansible-runner events folded into
per-host rows, `status` against live exporters, a real Prometheus and an unreachable host, `report` as a PNG."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import REPO, free_port, load, point_at_loopback, start_exporter, start_sim, stop, wait_http
from specdeploy.ops.fleet import Target
from specdeploy.ops.progress import journal_lines, parse_load
from specdeploy.ops.runner import HostRow, Run
from specdeploy.ops.status import fleet_status, scrape_exporter


def _sim_lines(engine: str) -> list[str]:
    """The load lines the simulator prints (the same shapes the engines print)."""
    r = subprocess.run([sys.executable, "-c", f"from specdeploy.testing.simulator import load_progress; "
                        f"load_progress('{engine}', 0.2)"], capture_output=True, text=True, check=True)
    return r.stdout.splitlines()


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_load_progress_from_engine_lines(engine):
    lines = _sim_lines(engine)
    # half-way through the weights, 10 s per 32 shards: 10 s to go
    half = [ln for ln in lines if "32/64" in ln][0]
    first = [ln for ln in lines if "0/64" in ln][0]
    p = parse_load([(1000.0, first), (1010.0, half)], now=1010.0)
    assert p.stage == "weights" and p.shards == (32, 64) and p.eta_s == pytest.approx(10.0)
    assert "shards 32/64" in p.text() and "ETA 10s" in p.text()
    p = parse_load([(1000.0 + i, ln) for i, ln in enumerate(lines)])
    assert p.shards == (64, 64) and p.kv_tokens == 1187264 and p.graphs == (20, 20)
    p = parse_load([(None, ln) for ln in lines] + [(None, "INFO:     Application startup complete.")])
    assert p.stage == "ready" and p.eta_s is None


def test_load_progress_from_upstream_line_shapes():
    """Lines as vLLM and SGLang print them (tqdm bars and their KV-cache / graph-capture messages)."""
    vllm = ["(EngineCore_DP0 pid=164) INFO 01-23 15:48:47 [gpu_model_runner.py:2602] Starting to load model",
            "Loading safetensors checkpoint shards:  40% Completed | 2/5 [00:00<00:00,  4.45it/s]",
            "(EngineCore_DP0 pid=164) INFO 01-23 15:49:30 [kv_cache_utils.py:1087] GPU KV cache size: 90,841 tokens",
            "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  45%|████▌     | 30/67 [00:03<00:04,  8.9it/s]"]
    p = parse_load([(None, ln) for ln in vllm])
    assert (p.shards, p.kv_tokens, p.graphs, p.stage) == ((2, 5), 90841, (30, 67), "cuda-graphs")
    sglang = ["Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00,  5.53it/s]",
              "[2026-03-04 03:06:30 TP0] KV Cache is allocated. #tokens: 1417338, KV size: 91.02 GB",
              "Capturing batches (bs=4 avail_mem=20.12 GB):  33%|███▎      | 1/3 [00:01<00:02,  1.02s/it]"]
    p = parse_load([(None, ln) for ln in sglang])
    assert (p.shards, p.kv_tokens, p.graphs) == ((1, 1), 1417338, (1, 3))


def test_journal_lines_start_at_the_units_last_start():
    text = ("1700000000.0 h python[1]: Loading safetensors checkpoint shards:  50% Completed | 32/64 [..]\n"
            "1700000001.0 h systemd[1]: Started specdeploy-vllm.service - specdeploy vLLM.\n"
            "1700000002.5 h python[2]: Loading safetensors checkpoint shards:   3% Completed | 2/64 [..]\n")
    lines = journal_lines(text, "specdeploy-vllm.service")
    assert lines[0][1].startswith("Started") and lines[-1] == (1700000002.5, lines[-1][1])
    assert parse_load(lines).shards == (2, 64)


# Real tasks of the inference_engine role, as ansible-runner reports them (its task_path: FILE:LINE); the live view
# reads each one's phase from the tags the playbooks declare (ops/phases.py)
START = "Start the engine, then the hosts that serve (restart when the release changed)"
WAIT = ("Wait for readiness, the unit and its health endpoint (fails at once on a crash loop), then a real chat "
        "completion; a rank that joins a leader watches its own unit and the leader's health")
RESULT = "Readiness result"


def _task_path(task: str) -> str:
    import yaml
    for f in sorted((REPO / "ansible" / "roles" / "inference_engine" / "tasks").glob("*.yml")):
        doc = yaml.compose(f.read_text())
        stack = [doc]
        while stack:
            node = stack.pop()
            if isinstance(node, yaml.SequenceNode):
                stack += node.value
            elif isinstance(node, yaml.MappingNode):
                for k, v in node.value:
                    if k.value == "name" and v.value == task:
                        return f"{f}:{node.start_mark.line + 1}"
                    if k.value in ("block", "rescue", "always"):
                        stack.append(v)
    return ""


def _ev(event, host, task="", role="", play="Deploy the engine", **data):
    return {"event": event, "event_data": {"host": host, "task": task, "role": role, "play": play,
                                           "task_path": _task_path(task), **data}}


def test_run_folds_events_into_rows_and_an_event_log(tmp_path):
    hosts = [Target(h, "192.0.2.1", "vllm", 8000, 9450, "specdeploy-vllm.service", ["true"]) for h in ("a", "b")]
    seen = []
    run = Run(hosts, tmp_path / "ev.jsonl", lambda r, h: seen.append((h, r.rows[h].phase)))
    run.event(_ev("runner_on_start", "a", START, "inference_engine"))
    run.event(_ev("runner_on_start", "b", START, "inference_engine"))
    run.event(_ev("runner_on_start", "a", WAIT, "inference_engine"))
    run.event(_ev("runner_on_start", "b", WAIT, "inference_engine"))
    run.event(_ev("runner_on_failed", "b", WAIT, "inference_engine", res={"msg": "Status code was -1"}))
    tri = {"root_cause": "ValueError: Eagle3 is only supported for ['llama'] models", "fix": "apply the patch set"}
    run.event(_ev("runner_on_ok", "b", "Triage the failure", "inference_engine",
                  res={"ansible_facts": {"inference_engine_triage": tri}}))
    run.event(_ev("runner_on_start", "a", RESULT, "inference_engine"))
    run.event({"event": "playbook_on_stats", "event_data": {"ok": {"a": 20, "b": 9}, "failures": {"b": 1},
                                                            "changed": {"a": 3}}})
    run.finish(2)
    assert run.rows["a"].result == "ok" and run.rows["a"].phase == "ready"
    assert run.rows["b"].result == "failed" and run.rows["b"].phase == "load" and run.rows["b"].triage == tri
    assert run.exit_code == 1
    assert ("a", "load") in seen and ("b", "load") in seen
    log = [json.loads(x) for x in (tmp_path / "ev.jsonl").read_text().splitlines()]
    assert any(e.get("triage") == tri for e in log)
    assert log[-1]["event"] == "finished" and log[-1]["rows"]["b"]["result"] == "failed"


def test_a_rescued_failure_is_not_a_failed_host(tmp_path):
    run = Run([Target("a", "x", "vllm", 1, 2, "u", ["true"])], tmp_path / "e.jsonl")
    run.event(_ev("runner_on_failed", "a", "Wait for readiness", "inference_engine", res={"msg": "x"}))
    run.event({"event": "playbook_on_stats", "event_data": {"ok": {"a": 5}, "rescued": {"a": 1}}})
    run.finish(0)
    assert run.rows["a"].result == "ok" and run.exit_code == 0


def test_deploy_bad_input_is_a_clean_error(tmp_path, example_inv):
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "deploy", "-i", str(tmp_path / "nope")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "deploy", "-i", str(point_at_loopback(example_inv)),
                        "--limit", "no-such-host"], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "report", "--range", "soon"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--range" in r.stderr


def test_preflight_errors_stop_the_deploy_before_ansible(example_inv, tmp_path):
    gv = example_inv / "group_vars" / "specdeploy_engines.yml"
    text = gv.read_text()
    assert 'vllm: "0.16.0"' in text  # the release this test makes unsupported
    gv.write_text(text.replace('vllm: "0.16.0"', 'vllm: "0.15.1"'))
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "deploy", "-i", str(example_inv), "--events",
                        str(tmp_path / "ev.jsonl")], capture_output=True, text=True, timeout=120)
    assert r.returncode in (1, 2) and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert not (tmp_path / "ev.jsonl").exists()  # nothing ran


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus package")
def test_status_and_report_from_live_exporters_and_prometheus(tmp_path):
    from specdeploy.plan.render.prometheus import render_prometheus
    from specdeploy.speculation.report import render
    addr = "127.0.0.4"
    ep, xp = free_port(addr), free_port(addr)
    procs = [start_sim("sglang", addr, ep, {"SPECDEPLOY_SIM_ACCEPTANCE": "0.8"})]
    gate = tmp_path / "gate.json"
    gate.write_text(json.dumps({"verdict": "keep", "timestamp": time.time(),
                                "levels": [{"concurrency": 8, "speedup": 1.7, "requests": 32, "errors": 0}]}))
    procs.append(start_exporter("sglang", f"http://{addr}:{ep}", addr, xp, gate_file=gate, info=("spec_tokens=3",)))
    try:
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(render_prometheus([{"host": "sg-1", "address": addr, "engine": "sglang", "engine_port": ep,
                                           "exporter_port": xp}], [], scrape_interval="1s"))
        port = free_port()
        procs.append(subprocess.Popen(["prometheus", f"--config.file={cfg}",
                                       f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                       f"--web.listen-address=127.0.0.1:{port}"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        prom = f"http://127.0.0.1:{port}"
        wait_http(f"{prom}/-/ready", timeout=30)
        t_end = time.time() + 14
        while time.time() < t_end:
            load(f"http://{addr}:{ep}", n=2, max_tokens=30)
        hosts = [Target("sg-1", addr, "sglang", ep, xp, "specdeploy-sglang.service", []),
                 Target("gone", "192.0.2.1", "vllm", 8000, 9450, "specdeploy-vllm.service", [])]
        t0 = time.monotonic()
        st = fleet_status(hosts, ["http://192.0.2.1:9090", prom], timeout=2.0)
        assert time.monotonic() - t0 < 5
        rows = {r["host"]: r for r in st["hosts"]}
        assert not rows["gone"]["reachable"] and "192.0.2.1" in rows["gone"]["error"]
        sg = rows["sg-1"]
        assert sg["up"] and sg["engine"] == "sglang" and sg["speculation"] == "on" and sg["gate"] == "keep"
        assert sg["acceptance_length"] > 2 and sg["tokens_per_s"] > 0 and 0 < sg["ttft_p50"] <= sg["ttft_p99"]
        assert sg["restarts"] == 0
        assert st["prometheus"] == prom and st["prometheus_errors"]
        direct = scrape_exporter(hosts[0])
        assert direct["acceptance_length"] == sg["acceptance_length"] or abs(
            direct["acceptance_length"] - sg["acceptance_length"]) < 1
        nccl = json.loads((REPO / "bench/nccl-h200x2/nvlink.json").read_text())
        res = render(prom, tmp_path / "report.png", 120, nccl, layers=61, k=3)
        png = (tmp_path / "report.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 30000
        assert res["last"]["acceptance"]["sg-1"] > 2 and res["last"]["tokens"]["sg-1"] > 0
        assert res["last"]["speedup"]["sg-1 c=8"] == 1.7
        assert 0 < res["last"]["allreduce"]["sg-1"] < 1
        # an engine outage that Prometheus saw counts as a restart
        stop(procs[0])
        time.sleep(3)
        procs[0] = start_sim("sglang", addr, ep)
        time.sleep(3)
        assert fleet_status(hosts[:1], [prom])["hosts"][0]["restarts"] == 1
    finally:
        stop(*procs)


def test_host_row_defaults():
    assert HostRow("x").phase == "waiting"


def test_staging_progress_from_a_real_rsync_log_and_a_hosts_progress_file(tmp_path, monkeypatch):
    """A `controller` copy: the progress rsync itself wrote (--info=progress2) into the controller log; a `shared`
    copy: the host's progress file, read over the host's ssh command (here a local shell)."""
    from specdeploy.ops import copy as staging
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.safetensors").write_bytes(b"\1" * (3 << 20))
    run = Run([Target("gpu-b", "x", "vllm", 1, 2, "u", ["false"])], tmp_path / "e.jsonl")
    log = staging.controller_log("gpu-b", "model")
    with log.open("w") as f:
        subprocess.run(["rsync", "-a", "--info=progress2", "--no-inc-recursive", "--bwlimit=2m", f"{src}/",
                        str(tmp_path / "dst")], stdout=f, stderr=subprocess.STDOUT, check=True)
    text = run.poll_stage("gpu-b")
    assert text.startswith("model 0.00") and "GB/s" in text and "ETA" in text, text
    p = staging.rsync_progress(log.read_text())
    assert p["bytes"] == 3 << 20 and p["percent"] == 100
    # a log from before this run is not this run's progress; the host's file is read instead
    os.utime(log, (run.started - 60, run.started - 60))
    state = tmp_path / "state"
    state.mkdir()
    (state / "staging-drafter.json").write_text(json.dumps({"line": "1.00/2.00 GB, 0.50 GB/s, ETA 2s"}))
    monkeypatch.setattr("specdeploy.plan.render.paths.STATE_DIR", str(state))
    run.targets["gpu-b"] = Target("gpu-b", "x", "vllm", 1, 2, "u", ["bash", "-c"])
    assert run.poll_stage("gpu-b") == "drafter 1.00/2.00 GB, 0.50 GB/s, ETA 2s"


# ---- status against peers that misbehave: each a thread on 127.0.0.1 with an ephemeral port ------------------
GOOD_EXPORTER = (b"# TYPE specdeploy_engine_up gauge\nspecdeploy_engine_up 1.0\n"
                 b'specdeploy_engine_info{engine="vllm",version="0.16.0",release="r-7",spec_tokens="3"} 1.0\n'
                 b"specdeploy_spec_acceptance_length 2.6\n")


class _Peer:
    """Answers every connection with ``kind``: good, garbage, binary, html500, huge, trickle."""

    def __init__(self, kind: str):
        import socket
        import threading
        self.kind, self.stopped = kind, threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        import threading
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        body = {"good": GOOD_EXPORTER, "garbage": b"specdeploy_engine_up {{{ nope\n",
                "binary": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "huge": b"#" * (9 << 20),
                "html500": b"<!DOCTYPE html><html><body><h1>500 Internal Server Error</h1></body></html>",
                "trickle": GOOD_EXPORTER}[self.kind]
        status, ctype = ("500 Internal Server Error", "text/html") if self.kind == "html500" else ("200 OK",
                                                                                                   "text/plain")
        with conn:
            try:
                conn.settimeout(5)
                conn.recv(65536)
                conn.sendall(f"HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n"
                             "connection: close\r\n\r\n".encode())
                if self.kind != "trickle":
                    conn.sendall(body)
                    return
                for b in body:  # one byte a second, for as long as the reader stays
                    if self.stopped.wait(1.0):
                        return
                    conn.sendall(bytes([b]))
            except OSError:
                pass

    def close(self):
        self.stopped.set()
        self.thread.join(2)
        self.sock.close()


BAD_PEERS = {"garbage": "not a metrics page", "binary": "binary data", "html500": "HTTP 500 (an HTML error page)",
             "huge": "over the 8,388,608-byte limit", "trickle": "no complete answer within 2 s"}


def test_status_marks_each_bad_peer_and_carries_on():
    """One good exporter among five bad ones and a Prometheus that trickles: every host gets its row, the bad ones
    with a short reason, all within about one --timeout because every peer is asked at once."""
    from specdeploy.cli.frontdoor import _status_table
    peers = {k: _Peer(k) for k in ["good", *BAD_PEERS]}
    prom = _Peer("trickle")
    try:
        hosts = [Target(k, "127.0.0.1", "vllm", 8000, p.port, "specdeploy-vllm.service", []) for k, p in peers.items()]
        t0 = time.monotonic()
        st = fleet_status(hosts, [f"http://127.0.0.1:{prom.port}"], timeout=2.0)
        wall = time.monotonic() - t0
        assert wall < 3.5, wall  # serially, or with per-read timeouts, this is minutes
        rows = {r["host"]: r for r in st["hosts"]}
        assert rows["good"]["up"] and rows["good"]["acceptance_length"] == 2.6 and "error" not in rows["good"]
        for kind, reason in BAD_PEERS.items():
            assert reason in rows[kind]["error"] and "up" not in rows[kind], rows[kind]
        assert st["prometheus"] is None and "no complete answer within 2 s" in st["prometheus_errors"][0]
        from rich.console import Console
        con = Console(width=200, record=True)
        con.print(_status_table(st))
        shown = con.export_text()
        assert shown.count("bad answer") == 4 and "r-7" in shown  # the trickle is the one left: no answer in time
        assert "trickle │ unreachable" in shown.replace("  ", " ").replace("  ", " ")
    finally:
        for p in [*peers.values(), prom]:
            p.close()


def test_status_command_is_bounded_by_its_timeout(example_inv):
    """`specdeploy status --timeout 2` against a peer that trickles one byte a second and one that sends binary:
    exit 1 (not every host is up), one row each, no traceback, in about the timeout."""
    import yaml
    slow, binary = _Peer("trickle"), _Peer("binary")
    try:
        (example_inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {
            "specdeploy_engines": {"hosts": {
                "gpu-a": {"ansible_host": "127.0.0.1", "specdeploy_exporter_port": slow.port},
                "gpu-b": {"ansible_host": "127.0.0.1", "specdeploy_exporter_port": binary.port}}},
            "specdeploy_monitoring": {"hosts": {}}}}}))
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "status", "-i", str(example_inv), "--timeout",
                            "2", "--prometheus", f"http://127.0.0.1:{free_port()}", "--json"],
                           capture_output=True, text=True, timeout=60)
        wall = time.monotonic() - t0
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        rows = {h["host"]: h for h in json.loads(r.stdout)["hosts"]}
        assert "within 2 s" in rows["gpu-a"]["error"] and "binary data" in rows["gpu-b"]["error"]
        assert wall < 12, wall  # the trickle alone would take 150 s; the rest is the CLI's own start-up
    finally:
        slow.close()
        binary.close()


@pytest.mark.parametrize("args, subject, words", [
    (["--timeout", "nan"], "--timeout", "not a finite number"),
    (["--timeout", "0"], "--timeout", "above 0"),
    (["--interval", "-1"], "--interval", "above 0"),
])
def test_status_refuses_nonsense_numbers(example_inv, args, subject, words):
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "status", "-i", str(example_inv), *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and subject in r.stderr and words in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("rng, words", [("3fortnights", "'3fortnights' is not a duration"),
                                        ("90", "'90' is not a duration"), ("1h30", "not a duration"),
                                        ("0m", "no time at all")])
def test_report_parses_its_range_strictly(rng, words):
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "report", "--prometheus", "http://127.0.0.1:9",
                        "--range", rng], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--range" in r.stderr and words in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("args, option, words", [(["--by", "rack"], "--by", "not a way to group"),
                                                  (["--host", "a\nb"], "--host", "not a label value"),
                                                  (["--release", "r" * 254], "--release", "not a label value")])
def test_report_refuses_a_bad_grouping_or_drill_down(tmp_path, args, option, words):
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "report", "--prometheus", "http://127.0.0.1:9",
                        "--out", str(tmp_path / "r.png"), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and option in r.stderr and words in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "r.png").exists()


def test_durations():
    from specdeploy.hostvars.argcheck import duration
    assert duration("30m", "--range") == 1800 and duration("1h30m", "--range") == 5400
    assert duration("2d", "--range") == 172800 and duration("500ms", "--range") == 0.5


def test_report_on_a_garbage_prometheus_is_a_clean_error(tmp_path):
    """A Prometheus address that answers an HTML page: one error naming it, no traceback, no PNG."""
    peer = _Peer("html500")
    try:
        r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "report", "--prometheus",
                            f"http://127.0.0.1:{peer.port}", "--range", "10m", "--out", str(tmp_path / "r.png")],
                           capture_output=True, text=True, timeout=60)
    finally:
        peer.close()
    assert r.returncode == 2 and "HTTP 500" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "r.png").exists()


def test_deploy_events_are_private_redacted_and_the_vault_reaches_ansible(example_inv, tmp_path, monkeypatch):
    """-e secrets (by name, nested, or vault ciphertext) never reach the event log, which is created 0600 in a
    0700 directory; --vault-password-file goes on to ansible-playbook with an absolute path."""
    import threading
    import types

    import ansible_runner
    from typer.testing import CliRunner

    from specdeploy.cli import app
    calls = []

    def fake_run_async(**kw):
        calls.append(dict(kw, extra_file=_extra_file(kw)))
        for host in ("gpu-a", "gpu-b"):
            kw["event_handler"](_ev("runner_on_start", host, "Install the API key", "inference_engine"))
            kw["event_handler"](_ev("runner_on_failed", host, "Install the API key", "inference_engine",
                                    res={"msg": "bad key hunter2-secret in \"hf_abcdef\""}))
        kw["event_handler"]({"event": "playbook_on_stats", "event_data": {"failures": {"gpu-a": 1, "gpu-b": 1}}})
        t = threading.Thread(target=lambda: None)
        t.start()
        return t, types.SimpleNamespace(rc=2)
    monkeypatch.setattr(ansible_runner, "run_async", fake_run_async)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pw").write_text("pw\n")
    old = os.umask(0o022)
    try:
        r = CliRunner().invoke(app, ["deploy", "-i", str(example_inv), "--skip-preflight", "--vault-password-file",
                                     "pw", "-e", "db_password=hunter2-secret", "-e",
                                     '{"hf": {"token": "hf_abcdef"}, "note": "$ANSIBLE_VAULT;1.1;AES256 00"}',
                                     "-e", "specdeploy_spec_num_tokens=3"])
    finally:
        os.umask(old)
    assert r.exit_code == 1 and r.exception is None or isinstance(r.exception, SystemExit), (r.output, r.exception)
    (run_dir,) = (tmp_path / ".cache" / "runs").iterdir()
    events = run_dir / "events.jsonl"
    assert stat_mode(run_dir) == 0o700 and stat_mode(events) == 0o600
    text = events.read_text()
    for secret in ("hunter2-secret", "hf_abcdef", "$ANSIBLE_VAULT"):
        assert secret not in text and secret not in r.output
    started = json.loads(text.splitlines()[0])
    assert started["extra"] == {"db_password": "<redacted>", "hf": {"token": "<redacted>"}, "note": "<redacted>",
                                "specdeploy_spec_num_tokens": 3}
    assert "bad key <redacted> in" in text
    (kw,) = calls
    assert kw["cmdline"].startswith(f"--vault-password-file {tmp_path / 'pw'} -e @")
    assert kw.get("extravars") is None  # the runner would write them to env/extravars
    path, values = kw["extra_file"]
    assert values["db_password"] == "hunter2-secret"  # ansible-playbook still gets the values, from a file...
    assert not os.path.exists(path) and not os.path.exists(kw["private_data_dir"])  # ...removed after the run
    assert not Path(kw["private_data_dir"]).is_relative_to(tmp_path)


def _extra_file(kw) -> tuple[str, dict] | None:
    """(path, values) of the -e @FILE the runner's command line names, read while the run lasts."""
    import shlex
    args = shlex.split(kw.get("cmdline") or "")
    files = [a[1:] for a in args if a.startswith("@") and a.endswith("extra-vars.json")]
    if not files:
        return None
    assert stat_mode(files[0]) == 0o600 and stat_mode(os.path.dirname(files[0])) == 0o700
    return files[0], json.loads(Path(files[0]).read_text())


def stat_mode(p) -> int:
    return os.stat(p).st_mode & 0o777


def test_a_vaulted_extra_vars_file_reaches_ansible_as_its_file_and_a_prompt_is_refused(example_inv, tmp_path,
                                                                                          monkeypatch):
    """The runner writes its extravars to disk: values from a vaulted `-e @FILE` go on as that file (which
    ansible-playbook decrypts), never decrypted into extravars; `--vault-id X@prompt` cannot be answered under the
    runner and is refused before anything runs."""
    import subprocess
    import threading
    import types

    import ansible_runner
    from typer.testing import CliRunner

    from specdeploy.cli import app
    calls = []

    def fake_run_async(**kw):
        calls.append(dict(kw, extra_file=_extra_file(kw)))
        kw["event_handler"]({"event": "playbook_on_stats", "event_data": {}})
        t = threading.Thread(target=lambda: None)
        t.start()
        return t, types.SimpleNamespace(rc=0)
    monkeypatch.setattr(ansible_runner, "run_async", fake_run_async)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pw").write_text("pw\n")
    secret_vars = tmp_path / "secret.yml"
    secret_vars.write_text("specdeploy_served_model_name: served-from-the-vault\n")
    subprocess.run(["ansible-vault", "encrypt", "--vault-password-file", str(tmp_path / "pw"), str(secret_vars)],
                   check=True, capture_output=True, timeout=120)
    r = CliRunner().invoke(app, ["deploy", "-i", str(example_inv), "--skip-preflight", "--vault-password-file", "pw",
                                 "-e", f"@{secret_vars}", "-e", "specdeploy_spec_num_tokens=3"])
    (kw,) = calls
    assert kw.get("extravars") is None
    assert kw["extra_file"][1] == {"specdeploy_spec_num_tokens": 3}
    assert f"-e @{secret_vars}" in kw["cmdline"]
    runner_files = "".join(p.read_text(errors="replace") for p in (tmp_path / ".cache").rglob("*") if p.is_file())
    assert "served-from-the-vault" not in runner_files + r.output

    r = CliRunner().invoke(app, ["deploy", "-i", str(example_inv), "--skip-preflight", "--vault-id", "prod@prompt"])
    assert r.exit_code == 2 and "--vault-id" in r.output and "password in a file" in r.output, r.output
    assert len(calls) == 1


def test_status_reads_a_serving_group_from_its_leader_and_shows_each_rank(tmp_path):
    """A rank that joins a leader has no exporter: its row is its group's, read from the leader's exporter (the
    real exporter over the simulator), never a request to the follower; targets() gives the ranks from the
    inventory."""
    import yaml

    from specdeploy.cli.frontdoor import _status_table
    from specdeploy.ops.fleet import targets
    inv = tmp_path / "hosts.yml"
    base = {"specdeploy_engine": "vllm", "specdeploy_engine_version": "0.16.0", "specdeploy_hardware": "h200_nvl8",
            "specdeploy_model_path": "/models/kimi", "specdeploy_served_model_name": "kimi"}
    inv.write_text(yaml.safe_dump({"all": {"children": {"specdeploy_engines": {"vars": base, "children": {
        "g": {"vars": {"specdeploy_topology": "tp", "specdeploy_group": "g"},
              "hosts": {"lead": {"ansible_host": "127.0.0.1"}, "follow": {"ansible_host": "192.0.2.7"}}}}}}}},
                                  sort_keys=False))
    found, _ = targets(str(inv))
    t = {x.host: x for x in found}
    assert (t["lead"].group, t["lead"].rank, t["lead"].leader) == ("g", 0, "lead")
    assert (t["follow"].rank, t["follow"].leader) == (1, "lead")
    ep, xp = free_port(), free_port()
    procs = [start_sim("vllm", "127.0.0.1", ep)]
    try:
        procs.append(start_exporter("vllm", f"http://127.0.0.1:{ep}", "127.0.0.1", xp))
        wait_http(f"http://127.0.0.1:{xp}/metrics", timeout=30)
        hosts = [dataclasses.replace(t["lead"], exporter_port=xp), t["follow"]]
        t0 = time.monotonic()
        st = fleet_status(hosts, [], timeout=2.0)
        assert time.monotonic() - t0 < 4  # 192.0.2.7 (unreachable) was never asked
        rows = {r["host"]: r for r in st["hosts"]}
        assert rows["lead"]["up"] and rows["follow"]["up"] and rows["follow"]["via"] == "lead"
        assert (rows["follow"]["group"], rows["follow"]["rank"]) == ("g", 1)
        assert rows["follow"]["engine"] == "vllm"
        from rich.console import Console
        console = Console(width=200, record=True)
        console.print(_status_table(st))
        text = console.export_text()
        assert "g rank 1 (via lead)" in text and "g rank 0" in text
        # the leader outside the selection: the follower's row says where its state is
        alone = fleet_status([t["follow"]], [], timeout=1.0)["hosts"][0]
        assert not alone["reachable"] and "leader lead is not in the selection" in alone["error"]
    finally:
        stop(*procs)


def test_the_forked_childs_lock_noise_is_dropped_and_every_other_unraisable_kept(monkeypatch):
    """The runner's fork (its pty, while the progress poller runs) may make CPython 3.11's child report
    "Exception ignored in: <built-in method release ...> RuntimeError: release unlocked lock": that one report
    is dropped; any other unraisable exception, and the same error from another object, still reaches the hook."""
    import sys
    import threading
    from specdeploy.ops import runner
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append((type(u.exc_value), str(u.exc_value))))
    runner.quiet_fork_noise()
    runner.quiet_fork_noise()  # once is enough: a second call does not wrap the hook again
    assert sys.unraisablehook.__closure__ is not None

    class U:
        def __init__(self, exc, obj):
            self.exc_value, self.object = exc, obj
    lock = threading.Lock()
    sys.unraisablehook(U(RuntimeError("release unlocked lock"), lock.release))
    sys.unraisablehook(U(RuntimeError("release unlocked lock"), object()))
    sys.unraisablehook(U(ValueError("x"), lock.release))
    assert seen == [(RuntimeError, "release unlocked lock"), (ValueError, "x")]
