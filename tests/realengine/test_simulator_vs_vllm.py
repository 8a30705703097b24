"""The simulator against the real vLLM 0.32.0 CPU build: the same rendered command line, the same requests, then
the same questions to both: the health sequence from launch to ready, /metrics (names, label names and the fixed
label values, types, help, buckets), the shapes of /v1/models and a chat completion, the log lines both print when
they serve and when SIGTERM stops them (as triage reads them), the exit codes of a stop and of refused command
lines. One real engine serves the module; the refused command lines cost the real engine's import time only."""
from __future__ import annotations

import json
import re
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdeploy.testing import realrun, tinymodels
from specdeploy.triage import normalise, triage_lines

pytestmark = pytest.mark.realengine

VERSION = "0.32.0"
K = 1
REQUESTS = [[{"role": "user", "content": f"name {n} prime numbers"}] for n in (2, 3, 5)]
# The one difference left: the simulator does not know the release it plays when it builds its metrics, and
# vLLM 0.32.0 exports a finish reason 0.16.0 lacks.
REAL_ONLY_LABEL_VALUES = {("vllm:request_success", "finished_reason"): {"repetition"}}


def simulated(eng: realrun.Engine, bare: list[str]) -> realrun.Engine:
    """The same engine argv (the venv's ``vllm serve ...``), served by `specdeploy simulate` for the same release."""
    argv = [sys.executable, "-m", "specdeploy.cli", "simulate", "--engine", "vllm", "--version", VERSION, "--"]
    env = {**eng.env, "PYTHONPATH": ":".join(p for p in sys.path if p), "SPECDEPLOY_SIM_LOAD_SECONDS": "2"}
    return realrun.Engine(argv + ["vllm"] + list(bare[1:]), env, eng.url, eng.served, eng.logdir.with_name("sim"),
                          eng.unit)


def health_sequence(eng: realrun.Engine, timeout: float = 240) -> list:
    """The distinct answers of /health from launch until 200: a status code, or 'refused' while nothing listens."""
    seq: list = []
    end = time.time() + timeout
    while time.time() < end and eng.proc.poll() is None:
        try:
            with urllib.request.urlopen(eng.url + "/health", timeout=5) as r:
                got = r.status
        except urllib.error.HTTPError as e:
            got = e.code
        except (ConnectionError, urllib.error.URLError):
            got = "refused"
        if not seq or seq[-1] != got:
            seq.append(got)
        if got == 200:
            break
        time.sleep(0.25)
    return seq


def families(text: str) -> dict:
    out = {}
    for f in text_string_to_metric_families(text):
        fixed, labels, buckets = {}, set(), set()
        for s in f.samples:
            labels.add((s.name.removeprefix(f.name), tuple(sorted(k for k in s.labels if k != "le"))))
            if "le" in s.labels:
                buckets.add(float(s.labels["le"]))
            for k in ("finished_reason", "engine"):
                if k in s.labels:
                    fixed.setdefault(k, set()).add(s.labels[k])
        out[f.name] = {"type": f.type, "help": f.documentation, "samples": labels, "buckets": buckets,
                       "values": fixed}
    return out


def shape(obj):
    """Keys and value types of a JSON answer, values left out."""
    if isinstance(obj, dict):
        return {k: shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [shape(obj[0])] if obj else []
    return type(obj).__name__


def generic(line: str) -> str:
    """A log line with what differs between any two runs (numbers: pids, times, ports) taken out."""
    return re.sub(r"\d+", "N", line)


def observe(eng: realrun.Engine) -> dict:
    eng.start()
    seq = health_sequence(eng)
    o = eng.wait_ready(60)
    for msgs in REQUESTS:
        eng.chat(msgs, max_tokens=16)
    chat = eng.chat(REQUESTS[0], max_tokens=8)
    with urllib.request.urlopen(eng.url + "/v1/models", timeout=10) as r:
        models = json.loads(r.read())
    metrics = eng.metrics()
    rc = eng.stop()
    lines = eng.log.read_text(errors="replace").splitlines()
    return {"health": seq, "ready": o.status, "chat": chat, "models": models, "metrics": families(metrics),
            "raw": metrics, "rc": rc, "lines": lines, "triage": triage_lines(lines).outcome}


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    realrun.tiny_cache_from_env()
    logs = tmp_path_factory.mktemp("sim-vs-vllm")
    hv = realrun.host_vars(tinymodels.target("llama"), tinymodels.drafter("llama", "good"), k=K, version=VERSION)
    argv, env, plan = realrun.command(hv)
    real = realrun.Engine(argv, {**env, "PATH": f"{hv.specdeploy_venv_path}/bin:/usr/bin:/bin",
                                 "HOME": str(logs), "HF_HUB_OFFLINE": "1"}, f"http://127.0.0.1:{hv.specdeploy_port}",
                          plan.served_model_name, logs / "real", plan.engine_unit)
    sim = simulated(real, argv)
    return observe(real), observe(sim)


def test_health_goes_from_refused_to_200_in_both(both):
    real, sim = both
    assert real["health"] == sim["health"] == ["refused", 200]
    assert real["ready"] == sim["ready"] == "ready"


def test_metrics_names_labels_types_help_and_buckets_agree(both):
    real, sim = both
    ours = {n: f for n, f in sim["metrics"].items() if n.startswith("vllm:")}
    assert ours
    for name, f in ours.items():
        assert name in real["metrics"], f"the simulator exports {name}, which vLLM {VERSION} does not"
        r = real["metrics"][name]
        for what in ("type", "help", "samples", "buckets"):
            assert f[what] == r[what], (name, what, f[what], r[what])
        for label, values in r["values"].items():
            only = REAL_ONLY_LABEL_VALUES.get((name.removesuffix("_created"), label), set())
            assert f["values"].get(label, set()) == values - only, \
                (name, label)
    # what specdeploy reads from the engine (the exporter's and the gate's names) is exported by both
    from specdeploy.engines import get
    m = get("vllm").metrics
    for name in list(m.spec_counters.values()) + list(m.serving.values()):
        fam = name.removesuffix("_total")
        assert fam in real["metrics"] and fam in ours, name


def test_api_answers_have_the_same_shape(both):
    real, sim = both
    assert shape(sim["models"]["data"][0]).items() <= shape(real["models"]["data"][0]).items()
    assert sim["models"]["data"][0]["root"] == real["models"]["data"][0]["root"]
    assert sim["models"]["data"][0]["max_model_len"] == real["models"]["data"][0]["max_model_len"] == 512
    rc, sc = real["chat"], sim["chat"]
    assert rc["id"].startswith("chatcmpl-") and sc["id"].startswith("chatcmpl-")
    assert {k: shape(sc)[k] for k in ("object", "model", "created", "usage")} == \
           {k: shape(rc)[k] for k in ("object", "model", "created", "usage")} | {"usage": shape(sc)["usage"]}
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert isinstance(sc["usage"][key], int) and isinstance(rc["usage"][key], int)
    assert sc["choices"][0]["message"]["role"] == rc["choices"][0]["message"]["role"] == "assistant"
    assert sc["choices"][0]["finish_reason"] == rc["choices"][0]["finish_reason"] == "length"


def test_serving_and_shutdown_lines_are_the_engines(both):
    real, sim = both
    assert real["rc"] == sim["rc"] == 0
    assert real["triage"] == sim["triage"] == "clean-shutdown"
    real_generic = {generic(line) for line in real["lines"]}
    mine = [line for line in sim["lines"] if line.startswith(("INFO:", "(")) and "simulator" not in line]
    assert mine
    records = {r.raw: r for r in normalise([(i, line) for i, line in enumerate(real["lines"], 1)])}
    for rec in normalise([(i, line) for i, line in enumerate(mine, 1)]):
        if rec.raw.startswith("INFO:") or "[shutdown]" in rec.raw:  # lines the real one prints word for word
            assert generic(rec.raw) in real_generic, rec.raw
        # every record, whatever its text, has the shape of the real engine's records
        real_like = next(r for r in records.values() if r.raw.startswith(rec.raw[:2]))
        assert (rec.proc is None) == (real_like.proc is None) and (rec.ts is None) == (real_like.ts is None)
        assert rec.level == real_like.level or rec.level in ("INFO", "WARNING", "ERROR"), rec.raw


@pytest.mark.parametrize("case,code,message", [
    ("unknown flag", 2, "vllm: error: unrecognized arguments: --bogus-flag 1"),
    ("unknown speculative key", 1, "bogus_key\n  Unexpected keyword argument "
                                   "[type=unexpected_keyword_argument, input_value=1, input_type=int]"),
])
def test_refused_command_lines_exit_and_say_the_same(tmp_path, case, code, message):
    """specdeploy's own checks refuse both lines before a deploy; here they are put on the rendered line after
    the checks, to see what each engine does with them."""
    realrun.tiny_cache_from_env()
    hv = realrun.host_vars(tinymodels.target("llama"), tinymodels.drafter("llama", "good"), k=K)
    argv, env, plan = realrun.command(hv)
    if case == "unknown flag":
        argv = argv + ["--bogus-flag", "1"]
    else:
        i = argv.index("--speculative-config") + 1
        argv[i] = json.dumps({**json.loads(argv[i]), "bogus_key": 1}, separators=(",", ":"))
    eng = realrun.Engine(argv, {**env, "PATH": f"{hv.specdeploy_venv_path}/bin:/usr/bin:/bin",
                                "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"},
                         f"http://127.0.0.1:{hv.specdeploy_port}", plan.served_model_name, tmp_path / "real",
                         plan.engine_unit).start()
    o = eng.wait_ready(180)  # readiness sees the crash at once, from the unit's state
    assert o.status == "crashed" and f"ExecMainStatus={code}" in o.detail, o
    real_out = eng.log.read_text()
    sim = simulated(eng, argv).start()
    assert sim.wait_exit(30) == code
    sim_out = sim.log.read_text()
    assert message in real_out and message in sim_out, (real_out[-600:], sim_out)
