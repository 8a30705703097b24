"""The engine registry: a third engine, defined in one test-only module (tests/engines_fake.py) and registered
through the registry API, goes through plan, preflight, the exporter, the rules and dashboard, and the simulator
with no other file changed; and the registry drives the schema's engine choices."""
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
import yaml
from typer.testing import CliRunner

import engines_fake
from helpers import free_port, wait_http
from specdeploy import engines
from specdeploy.speculation import metrics
from specdeploy.speculation import monitoring
from specdeploy.cli import app
from specdeploy.values.errors import SpecdeployError
from specdeploy.speculation.exporter import SpecCollector, parse_engine_metrics
from specdeploy.hostvars.schema import validate_host
from specdeploy.hostvars.schema_docs import field_spec

from helpers import TESTS  # noqa: E402
MODEL = TESTS.parent / "examples/models/kimi-k2.5-int4"
DRAFTER = TESTS.parent / "examples/models/kimi-k2.5-eagle3"


@pytest.fixture
def toyserve():
    engines_fake.install()
    yield engines_fake.ToyServe
    engines_fake.uninstall()


@pytest.fixture
def toy_inv(example_inv, toyserve):
    gv = example_inv / "group_vars" / "specdeploy_engines.yml"
    data = yaml.safe_load(gv.read_text())
    data.update(specdeploy_engine="toyserve", specdeploy_engine_version="1.1.0", specdeploy_port=7070)
    gv.write_text(yaml.safe_dump(data))
    return example_inv


def test_builtin_engines_are_registered_and_the_schema_takes_its_choices_from_the_registry(toyserve):
    assert engines.names()[:2] == ("vllm", "sglang")
    assert "toyserve" in engines.names() and engines.get("toyserve") is toyserve
    assert field_spec("specdeploy_engine")["choices"] == list(engines.names())
    engines_fake.uninstall()
    assert "toyserve" not in engines.names() and "toyserve" not in field_spec("specdeploy_engine")["choices"]
    with pytest.raises(engines.UnsupportedVersion, match="unknown engine 'toyserve'; supported: vllm, sglang"):
        engines.get("toyserve")
    engines_fake.install()


def test_schema_rejects_an_unregistered_engine_by_name():
    base = {"specdeploy_engine_version": "1.1.0", "specdeploy_hardware": "h200_nvl8",
            "specdeploy_model_path": "/m", "specdeploy_spec_enabled": False}
    with pytest.raises(SpecdeployError) as exc:
        validate_host("h", dict(base, specdeploy_engine="toyserve"))
    assert [(p.subject, p.message) for p in exc.value.problems] == \
        [("specdeploy_engine", "Input should be 'vllm' or 'sglang'")]
    engines_fake.install()
    try:
        assert validate_host("h", dict(base, specdeploy_engine="toyserve")).specdeploy_engine == "toyserve"
    finally:
        engines_fake.uninstall()


def test_plan_renders_the_third_engine(toy_inv, tmp_path):
    r = CliRunner().invoke(app, ["plan", "-i", str(toy_inv), "--json", "--limit", "gpu-a"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)["hosts"]["gpu-a"]
    argv = plan["argv"]
    assert argv[:4] == ["toyserve", "run", "--model", "/models/kimi-k2.5-int4"]
    # the profile default (PCIe: no peer-to-peer all-reduce) comes from the adapter
    assert "--no-p2p" in argv
    draft = json.loads(argv[argv.index("--draft-config") + 1])
    assert draft == {"model": "/var/lib/specdeploy/drafter/toyserve", "tokens": 3}
    assert plan["env"]["TOYSERVE_TELEMETRY"] == "off"
    assert plan["engine_unit"] == "specdeploy-toyserve.service"
    assert plan["image"].startswith("specdeploy/toyserve:1.1.0-none")
    files = plan["files"]
    unit = files["/etc/systemd/system/specdeploy-toyserve.service"]
    assert "/etc/specdeploy/secrets/specdeploy-toyserve.env" in unit  # the API key reaches it through its env
    exporter = files["/etc/systemd/system/specdeploy-exporter.service"]
    assert "--engine toyserve" in exporter
    prom = json.loads(r.output)["prometheus"]
    assert ':7070"]' in prom and 'labels: {host: "gpu-a", engine: "toyserve"}' in prom


def test_plan_refuses_flags_the_engine_version_lacks(toy_inv):
    r = CliRunner().invoke(app, ["plan", "-i", str(toy_inv), "-e", "specdeploy_engine_version=1.0.0",
                                 "-e", '{"specdeploy_engine_extra_args": ["--draft-config={}"]}'])
    assert r.exit_code != 0
    assert "--draft-config is not a flag specdeploy knows for toyserve 1.0.0" in r.output


def test_preflight_runs_the_adapters_checks(toy_inv):
    ok = CliRunner().invoke(app, ["preflight", "-i", str(toy_inv), "--json", "--limit", "gpu-a"])
    old = CliRunner().invoke(app, ["preflight", "-i", str(toy_inv), "--json", "--limit", "gpu-a",
                                   "-e", "specdeploy_engine_version=1.0.0"])
    assert "cannot run a draft model" not in ok.output
    # the drafter doctor ran with the adapter's conventions (the example drafter is a flat Llama EAGLE-3 one)
    found = {(f["subject"], f["message"]) for f in json.loads(ok.output)["hosts"]["gpu-a"]["findings"]}
    assert ("drafter engine", "rules of toyserve 1.1.0") in found and ("drafter format", "flat Llama EAGLE-3") in found
    assert not any(s.startswith("drafter architectures") for s, _ in found)  # its name is one the adapter loads
    assert old.exit_code != 0 and "ToyServe 1.0.0 cannot run a draft model" in old.output
    assert "pin ToyServe >= 1.1.0" in old.output


def test_rules_and_dashboard_query_the_third_engine(toyserve):
    assert "toyserve:cache_fill" in monitoring.render_rules()
    dash = monitoring.dashboard()
    assert "toyserve" in dash["tags"]
    exprs = [t["expr"] for p in dash["panels"] if p.get("type") == "timeseries" for t in p["targets"]]
    assert any("rate(toyserve:output_tokens_total[$__rate_interval])" in e for e in exprs)
    assert any("toyserve:first_token_seconds_bucket" in e for e in exprs)
    assert any("sum by (host) (toyserve:active)" in e for e in exprs)
    # the built-in engines' queries are unchanged by the third one, which is one more `or` branch
    assert metrics.q_kv() == ("max by (host) (vllm:kv_cache_usage_perc) or max by (host) (sglang:token_usage) "
                              "or max by (host) (toyserve:cache_fill)")


def test_exporter_maps_the_third_engines_counters():
    text = ("# TYPE toyserve:drafts counter\ntoyserve:drafts_total 10\n"
            "# TYPE toyserve:draft_tokens counter\ntoyserve:draft_tokens_total 30\n"
            "# TYPE toyserve:accepted_tokens counter\ntoyserve:accepted_tokens_total 15\n"
            "# TYPE toyserve:accepted_at counter\ntoyserve:accepted_at_total{position=\"0\"} 9\n"
            "toyserve:accepted_at_total{position=\"1\"} 6\n")
    engines_fake.install()
    try:
        s = parse_engine_metrics("toyserve", text, 0.0)
    finally:
        engines_fake.uninstall()
    assert (s.drafts, s.draft_tokens, s.accepted, s.per_pos) == (10, 30, 15, {"0": 9, "1": 6})


def _sim(port: int, env: dict, version: str = "1.1.0") -> subprocess.Popen:
    """``specdeploy simulate`` for the third engine, in a process that registers it first."""
    code = ("import sys, engines_fake; engines_fake.install(); from specdeploy.cli import main; "
            "sys.argv = ['specdeploy'] + sys.argv[1:]; main()")
    argv = [sys.executable, "-c", code, "simulate", "--engine", "toyserve", "--version", version, "--",
            "toyserve", "run", "--model", str(MODEL), "--served-name", "toy", "--host", "127.0.0.1",
            "--port", str(port), "--tp", "2", "--draft-config", json.dumps({"model": str(DRAFTER), "tokens": 3})]
    pp = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen(argv, env=dict(os.environ, PYTHONPATH=pp, SPECDEPLOY_SIM_LOAD_SECONDS="0",
                                           SPECDEPLOY_SIM_STEP_MS="2", **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_simulator_plays_the_third_engine_and_the_exporter_reads_it(toyserve):
    port = free_port()
    p = _sim(port, {"SPECDEPLOY_SIM_ACCEPTANCE": "0.8", "SPECDEPLOY_SIM_SEED": "5", "TOYSERVE_KEY": "k1"})
    try:
        wait_http(f"http://127.0.0.1:{port}/health")
        base = f"http://127.0.0.1:{port}"
        denied = urllib.request.Request(base + "/v1/models")
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(denied, timeout=5)
        assert exc.value.code == 401  # the key came through the adapter's own variable
        hdr = {"Authorization": "Bearer k1", "Content-Type": "application/json"}
        models = json.load(urllib.request.urlopen(urllib.request.Request(base + "/v1/models", headers=hdr)))
        assert models["data"][0]["id"] == "toy"
        for _ in range(4):
            body = json.dumps({"model": "toy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40})
            urllib.request.urlopen(urllib.request.Request(base + "/v1/chat/completions", body.encode(), hdr),
                                   timeout=30).read()
        col = SpecCollector("toyserve", base, window=60, cache_s=0)
        got = {f.name: f for f in col.collect()}
        assert got["specdeploy_engine_up"].samples[0].value == 1
        rate = got["specdeploy_spec_acceptance_rate"].samples[0].value
        al = got["specdeploy_spec_acceptance_length"].samples[0].value
        assert 0.55 < rate < 0.95 and 2.5 < al < 4.0  # alpha 0.8 at k=3
        positions = got["specdeploy_spec_position_acceptance_rate"].samples
        assert [s.labels["position"] for s in positions] == ["0", "1", "2"]
    finally:
        p.terminate()
        out, err = p.communicate(timeout=10)
    assert "toyserve: ready to serve" in out and "speculative=k=3" in out


def test_simulator_refuses_and_crashes_as_the_third_engine(toyserve):
    p = _sim(free_port(), {}, version="1.0.0")  # --draft-config does not exist in 1.0.0
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "toyserve: error: unrecognized arguments: --draft-config" in err
    p = _sim(free_port(), {"SPECDEPLOY_SIM_CRASH": "load"})
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1
    assert err.count("FATAL: out of memory while loading") == 2  # one line per rank at --tp 2
    assert "toyserve: warming up 20/20" in out


def test_unknown_engine_is_a_clean_error_everywhere():
    for args in (["exporter", "--engine", "toyserve", "--engine-url", "http://127.0.0.1:1"],
                 ["engine", "standin", "--engine", "toyserve", "--version", "1", "--out", "/tmp/x"],
                 ["patch", "status", "--engine", "toyserve", "--root", "/tmp"]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2 and "unknown engine 'toyserve'" in r.output and "Fix: use vllm or sglang" in r.output
        assert "Traceback" not in r.output


def test_the_registry_refuses_a_second_engine_under_a_taken_name_and_lists_the_engines_on_an_unknown_one(toyserve):
    import pytest

    from specdeploy import engines
    from specdeploy.engines import UnsupportedVersion

    class Impostor(engines_fake.ToyServe):
        pass
    with pytest.raises(ValueError) as e:
        engines.register(Impostor)
    assert "'toyserve' is registered already" in str(e.value) and "vllm" in str(e.value)
    assert engines.get("toyserve") is engines_fake.ToyServe  # the first one stays
    engines.register(engines_fake.ToyServe)  # the same class again changes nothing
    with pytest.raises(UnsupportedVersion) as e:
        engines.get("vlm")
    assert "supported: vllm, sglang, toyserve" in str(e.value)
