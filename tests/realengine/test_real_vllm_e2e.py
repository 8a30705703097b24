"""The real vLLM 0.32.0 CPU build, end to end: the engine started from the command line specdeploy renders for a
host (testing/realrun.py), passed by specdeploy's readiness code and a real chat completion; the exporter's
figures against the engine's own /metrics; the gate's verdicts over real baseline and speculative runs; triage of a
real SIGTERM and a real kill -9. (The MLA + MoE kimi_k2 target with an EAGLE-3 drafter: test_real_vllm_price.py, on
the engine that measures its band schedule.)

Engines are few (each launch costs 30-90 s of two cores) and one runs at a time: an idle vLLM CPU worker polls
its queue and takes CPU from the engine being measured. The baseline is measured and stopped first, then the good
drafter's engine serves the tests up to its SIGTERM, then the random drafter's up to its kill -9."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.core import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specdeploy.speculation.exporter import SpecCollector, parse_engine_metrics
from specdeploy.speculation.gate import gate, verdict_overrides
from specdeploy.plan import render_host
from specdeploy.testing import realrun, tinymodels

pytestmark = pytest.mark.realengine

K = 1  # the good drafter predicts the first draft position only (tinymodels)
# The good drafter's engine speculates at one running request only: k per load band, as the gate writes it and
# vLLM takes it (num_speculative_tokens_per_batch_size); from two running requests on it drafts nothing.
BANDS = {"specdeploy_spec_k_by_batch": [{"from_batch": 1, "k": K}, {"from_batch": 2, "k": 0}]}
GATE = dict(concurrency=[1], requests=16, max_tokens=64)


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("real-vllm")


@pytest.fixture(scope="module")
def llama():
    realrun.tiny_cache_from_env()
    return tinymodels.target("llama")


def _serve(target, drafter, logdir, extra=None):
    eng = realrun.serve(realrun.host_vars(target, drafter, k=K, extra=extra), logdir)
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def baseline(llama, logs):
    """The gate's baseline run without speculation, measured and stopped (SIGTERM) before any other engine."""
    eng = realrun.serve(realrun.host_vars(llama, None), logs / "baseline")
    try:
        report = gate(eng.url, "vllm", **GATE)
    finally:
        rc = eng.stop()
    return eng, report, rc


@pytest.fixture(scope="module")
def good(baseline, llama, logs):
    yield from _serve(llama, tinymodels.drafter("llama", "good"), logs / "good", BANDS)


@pytest.fixture(scope="module")
def random_drafter(llama, logs):
    yield from _serve(llama, tinymodels.drafter("llama", "random"), logs / "random")


def totals(text: str) -> dict:
    """The engine's speculative counters, summed over their label sets, read straight from its exposition."""
    out = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "per_pos": {}}
    names = {"vllm:spec_decode_num_drafts_total": "drafts", "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens_total": "accepted"}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in names:
                out[names[s.name]] += s.value
            elif s.name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
                out["per_pos"][s.labels["position"]] = out["per_pos"].get(s.labels["position"], 0.0) + s.value
    return out


def exported(url: str) -> dict[str, dict]:
    """specdeploy_* samples as Prometheus would scrape them from the exporter: name -> {labels: value}."""
    reg = CollectorRegistry()
    reg.register(SpecCollector("vllm", url))
    out: dict[str, dict] = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def triage(*files: Path) -> dict:
    p = subprocess.run([sys.executable, "-m", "specdeploy.cli", "triage", *map(str, files), "--json"],
                       capture_output=True, text=True, timeout=120)
    return json.loads(p.stdout)


# ---- the rendered command line and readiness -----------------------------------------------------------------
def test_the_engine_runs_the_command_line_specdeploy_renders_and_passes_readiness(good, llama):
    hv = realrun.host_vars(llama, tinymodels.drafter("llama", "good"), k=K, port=int(good.url.rsplit(":", 1)[1]),
                           extra=BANDS)
    plan = render_host(realrun.HOST, hv, "127.0.0.1")
    running = Path(f"/proc/{good.proc.pid}/cmdline").read_bytes().split(b"\0")[:-1]
    argv = [a.decode() for a in running]
    # the interpreter runs the venv's vllm script; after it, the plan's argv with only the drafter relocated
    assert argv[1] == f"{hv.specdeploy_venv_path}/bin/vllm"
    want = [a.replace(plan.drafter_path, hv.specdeploy_drafter_path) for a in plan.argv[1:]]
    assert argv[2:] == want
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": hv.specdeploy_drafter_path, "num_speculative_tokens": K,
                    "num_speculative_tokens_per_batch_size": [[1, 1, K], [2, 2, 0]]}
    assert good.ready.status == "ready" and good.ready.detail == f"{good.url}/health answered 200"
    assert good.ready.state["ActiveState"] == "active"
    assert good.answer["choices"][0]["message"]["content"]
    assert good.answer["usage"]["completion_tokens"] > 0
    log = good.log.read_text()
    assert "Resolved architecture: LlamaForCausalLMEagle3" in log
    assert f"speculative_config=SpeculativeConfig(method='eagle3', model='{hv.specdeploy_drafter_path}', " \
           f"num_spec_tokens={K})" in log


# ---- the exporter against the engine's own /metrics ----------------------------------------------------------
def test_exporter_figures_equal_the_engines_metrics(good):
    for i in range(4):
        good.chat([{"role": "user", "content": f"count to {i + 3}"}], max_tokens=24)
    raw = good.metrics()
    t = totals(raw)
    assert t["drafts"] > 0 and t["draft_tokens"] == K * t["drafts"] and t["accepted"] > 0
    assert set(t["per_pos"]) == {str(p) for p in range(K)}
    s = parse_engine_metrics("vllm", raw, 0.0)
    assert (s.drafts, s.draft_tokens, s.accepted, s.per_pos) == (t["drafts"], t["draft_tokens"], t["accepted"],
                                                                 t["per_pos"])
    itl = [x for f in text_string_to_metric_families(raw) for x in f.samples
           if x.name.startswith("vllm:inter_token_latency_seconds_")]
    assert s.itl_count == sum(x.value for x in itl if x.name.endswith("_count")) > 0
    assert s.itl_sum == pytest.approx(sum(x.value for x in itl if x.name.endswith("_sum")))
    assert totals(good.metrics()) == t  # no traffic since: the exporter reads the same counters
    e = exported(good.url)
    assert e["specdeploy_engine_up"][()] == 1.0
    assert e["specdeploy_spec_drafts_total"][()] == t["drafts"]
    assert e["specdeploy_spec_draft_tokens_total"][()] == t["draft_tokens"]
    assert e["specdeploy_spec_accepted_tokens_total"][()] == t["accepted"]
    assert e["specdeploy_spec_acceptance_rate"][()] == pytest.approx(t["accepted"] / t["draft_tokens"])
    assert e["specdeploy_spec_acceptance_length"][()] == pytest.approx(1 + t["accepted"] / t["drafts"])
    for p, v in t["per_pos"].items():
        assert e["specdeploy_spec_position_acceptance_rate"][(("position", p),)] == pytest.approx(v / t["drafts"])
    # the good drafter's first draft token is the target's own next token: nearly every draft is accepted
    assert t["accepted"] / t["drafts"] > 0.8


def test_the_engine_speculates_per_load_band(good):
    """k per load band in the real engine's scheduler: a request for one sequence drafts every step (k=1 at one
    running request); a request for four (n=4: four sequences scheduled together, --max-num-seqs 4) drafts
    nothing (k=0 from two running requests), although the same drafter serves them. Without the bands both
    would draft once per step of each sequence: once per two tokens or more often (sampled sequences accept
    less than greedy ones). (Separate
    concurrent requests overlap only as the host's load lets them: in a CI run, eight of them drafted 0.34 per
    token, against 0.003 on an idle machine.)"""
    from specdeploy.values import peerhttp

    def drafts_per_token(n: int) -> float:
        before, gen0 = parse_engine_metrics("vllm", good.metrics(), 0.0), _generated(good.metrics())
        for i in range(2):
            # n > 1 needs sampling (the engine refuses n > 1 with greedy); every sequence runs to max_tokens
            sampling = {"temperature": 0} if n == 1 else {"temperature": 1.0, "seed": i, "ignore_eos": True}
            body = json.dumps({"model": good.served, "n": n, "max_tokens": 48, **sampling,
                               "messages": [{"role": "user", "content": f"write about the number {i}"}]}).encode()
            ans = peerhttp.json_object(good.url + "/v1/chat/completions", 300,
                                       headers={"content-type": "application/json"}, body=body)
            assert len(ans["choices"]) == n, ans
        after = parse_engine_metrics("vllm", good.metrics(), 0.0)
        return (after.drafts - before.drafts) / max(1.0, _generated(good.metrics()) - gen0)
    alone, together = drafts_per_token(1), drafts_per_token(4)
    assert alone > 0.3, alone  # about one draft per step, each step yielding up to two tokens
    assert together < 0.25 * alone, (alone, together)


def _generated(text: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "vllm:generation_tokens_total")


# ---- the gate over real runs, and how each engine ended --------------------------------------------------------
def test_gate_measures_a_baseline_and_judges_the_good_drafter_by_its_interval(baseline, good):
    """The gate over the real engine: the acceptance it reads is the good drafter's (its first draft token is the
    target's own next token), the speedup is the ratio of the two runs, and the verdict is the one its interval
    allows. Which verdict that is, is not fixed here: on two CPU cores the good drafter at k=1 gains little
    (paired baseline/good runs on an idle machine, the other engine frozen: 1.04x, 1.08x, 1.12x, 1.17x), and two
    engine instances started one after the other differ by more than that (the same pair, one after the other:
    0.92x, 95% interval 0.81-1.04x, so disable; 1.05x in a CI run). A win against that noise is the simulator's
    to show (tests/unit/speculation/test_gate.py, the sandbox gate tests)."""
    _, base, _ = baseline
    assert base["verdict"] is None and base["speculation"] is False and not base.get("refused")
    assert base["levels"][0]["errors"] == 0 and base["levels"][0]["output_tps"] > 0
    kept = gate(good.url, "vllm", **GATE, baseline=base, k=K)
    assert kept["failed_requests"] == 0 and kept["speculation"] is True
    lv = kept["levels"][0]
    assert lv["acceptance_length"] > 1.8
    assert lv["speedup"] == pytest.approx(lv["output_tps"] / base["levels"][0]["output_tps"])
    assert len(lv["rounds_tps"]) == 4 and len(base["levels"][0]["rounds_tps"]) == 4
    assert lv["output_tps"] == pytest.approx(lv["output_tokens"] / lv["wall_s"])
    lo, hi = lv["speedup_interval"]
    assert lo <= lv["speedup"] <= hi
    assert lv["baseline_aa"]["interval"][0] <= lv["baseline_aa"]["ratio"] <= lv["baseline_aa"]["interval"][1]
    margin = kept["margin"]
    if kept["verdict"] == "keep":
        assert lv["speedup"] >= 1 + margin and lo >= 1.0, kept
    elif kept["verdict"] == "disable":
        assert hi < 1 + margin, kept  # acceptance was high: only a measured loss disables
    else:
        assert kept["verdict"] is None and "spread between rounds" in kept["refused"], kept
        assert verdict_overrides(kept) == {}


def test_sigterm_is_a_clean_shutdown(baseline, good):
    assert good.stop() == 0
    for eng, rc in ((good, 0), (baseline[0], baseline[2])):
        assert rc == 0
        alone = triage(eng.log)
        assert alone["outcome"] == "clean-shutdown", alone
        assert "[shutdown]" in alone["evidence"][0]["text"] or "SIGTERM" in alone["evidence"][0]["text"]
        assert triage(eng.log, eng.unit_log)["outcome"] == "clean-shutdown"
        assert eng.unit_log.read_text() == "specdeploy-vllm.service: Deactivated successfully.\n"


def test_gate_disables_the_random_drafter(baseline, good, random_drafter):
    assert good.returncode is not None  # the good drafter's engine is stopped: one engine at a time
    dropped = gate(random_drafter.url, "vllm", **GATE, baseline=baseline[1], k=K)
    assert dropped["failed_requests"] == 0 and dropped["speculation"] is True
    assert dropped["levels"][0]["acceptance_length"] < 1.1
    assert dropped["verdict"] == "disable", dropped["reason"]
    assert verdict_overrides(dropped) == {"specdeploy_spec_enabled": False}


def test_kill_9_is_killed(random_drafter):
    assert random_drafter.kill(timeout=10) == -9  # its engine core outlives it: killed after 10 s, not 60
    assert random_drafter.unit_log.read_text().startswith(
        "specdeploy-vllm.service: Main process exited, code=killed, status=9/KILL\n")
    res = triage(random_drafter.log, random_drafter.unit_log)
    assert res["outcome"] == "killed", res
    assert "SIGKILL" in res["root_cause"]
    # the engine core and its worker do not end with the API server (systemd's control-group kill ends them)
    assert not random_drafter._group_alive()
