"""The measured price where decisions are made: the exporter publishes the acceptance length the host's surface
says 1.0x needs at the load the engine is in now, and the continuous gate's rule compares the live acceptance
length with it instead of the gate's step-time ratio (promtool), only for the engine, release and k it was
measured for."""
import json
import shutil
import subprocess
import sys

import pytest
import yaml

from specdeploy.speculation import surface as S
from specdeploy.speculation.exporter import SpecCollector, parse_engine_metrics
from specdeploy.speculation.monitoring import render_rules
from specdeploy.speculation.surfacemetrics import SurfaceFigures

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="needs Debian's prometheus package (scripts/setup.sh installs it)")


def _surface(engine="vllm", release="0.32.0", k=2) -> dict:
    """k=2 measured at loads 1 and 8: at load 1 the speedup is AL / 1.4, at load 8 AL / 2.2 (1.0x needs 1.4 and
    2.2), each point with a 5% interval."""
    pts = []
    for c, ratio in ((1, 1.4), (8, 2.2)):
        for al in (1.2, 2.0, 2.8):
            sp = al / ratio
            pts.append({"k": k, "concurrency": c, "al_measured": al, "speedup": sp,
                        "speedup_interval": [sp * 0.95, sp * 1.05]})
    return {"kind": S.KIND, "engine": engine, "release": release, "margin": 0.1, "concurrency": [1, 8],
            "points": pts}


def test_the_needed_al_follows_the_load_band_and_only_for_the_engine_release_and_k_measured(tmp_path):
    f = tmp_path / "surface.json"
    figs = SurfaceFigures(f)
    assert figs.collect("vllm", "0.32.0", 2, 3.0) == [] and figs.problem == ""  # no surface: nothing, no problem
    f.write_text(json.dumps(_surface()))
    out = {fam.name: fam for fam in figs.collect("vllm", "0.32.0", 2, 0.0)}
    bands = {(s.labels["from_batch"], s.labels["speedup"]): s.value
             for s in out["specdeploy_surface_needed_acceptance_length"].samples}
    # bands start at the measured levels: 1 running request, and from the midpoint 3 (kbands.band_starts)
    assert bands[("1", "1.0")] == pytest.approx(1.4) and bands[("1", "margin")] == pytest.approx(1.54)
    assert sorted({b for b, _ in bands}) == ["1", "3"] and bands[("3", "1.0")] == pytest.approx(2.2)
    now = out["specdeploy_surface_needed_acceptance_length_now"].samples[0].value
    assert now == pytest.approx(1.4)  # idle: the first band
    busy = {fam.name: fam for fam in figs.collect("vllm", "0.32.0", 2, 6.0)}
    assert busy["specdeploy_surface_needed_acceptance_length_now"].samples[0].value == pytest.approx(2.2)
    # another release, another engine, another k: no figures, and the problem says what to do
    for args, words in ((("vllm", "0.33.0", 2), "measure again"), (("sglang", "0.5.23", 2), "vllm 0.32.0"),
                        (("vllm", "0.32.0", 3), "--k 3")):
        assert figs.collect(*args, 1.0) == [] and words in figs.problem, (args, figs.problem)
    f.write_text("{not json")
    assert figs.collect("vllm", "0.32.0", 2, 1.0) == [] and "not JSON" in figs.problem
    f.write_text(json.dumps({**_surface(), "points": [{"k": True}]}))
    assert figs.collect("vllm", "0.32.0", 2, 1.0) == [] and "positive integer" in figs.problem


def test_the_exporter_reads_running_requests_and_publishes_the_surface_beside_its_figures(tmp_path):
    page = ("# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{engine="0"} 4\nvllm:num_requests_running{engine="1"} 2\n'
            "# TYPE vllm:spec_decode_num_drafts counter\nvllm:spec_decode_num_drafts_total 10\n")
    s = parse_engine_metrics("vllm", page, 0.0)
    assert s.running == 6.0
    f = tmp_path / "surface.json"
    f.write_text(json.dumps(_surface()))
    col = SpecCollector("vllm", "http://127.0.0.1:9", info={"version": "0.32.0", "spec_tokens": "2"},
                        surface_file=f)
    got = {fam.name: fam for fam in col._surface(col.info, [s])}
    assert got["specdeploy_surface_needed_acceptance_length_now"].samples[0].value == pytest.approx(2.2)
    off = SpecCollector("vllm", "http://127.0.0.1:9", info={"version": "0.32.0", "spec_tokens": "0"},
                        surface_file=f)
    assert off._surface(off.info, [s]) == []  # speculation off: nothing to compare with
    valid = {tuple(x.labels.items()): x.value for fam in col.collect() if fam.name ==
             "specdeploy_exporter_input_valid" for x in fam.samples}
    assert valid[(("file", "surface"),)] == 1.0
    f.write_text("[]")
    valid = {tuple(x.labels.items()): x.value for fam in col.collect() if fam.name ==
             "specdeploy_exporter_input_valid" for x in fam.samples}
    assert valid[(("file", "surface"),)] == 0.0


RECORD = "specdeploy:spec_predicted_speedup"
ANNOTATIONS = {"summary": "Speculation on gpu-a now runs at about 0.90x of none (live acceptance length over the one "
                          "1.0x needs: the host's measured price at its load now where it has one, else the gate's "
                          "step-time ratio)",
               "description": "Below 1.0 for 10m. `specdeploy regate` (or a deploy with specdeploy_spec_gate) "
                              "measures again and keeps k, reduces it, or disables speculation."}


@needs_promtool
def test_the_continuous_gate_compares_live_acceptance_with_the_measured_price_where_one_exists(tmp_path):
    rules = tmp_path / "specdeploy.rules.yml"
    rules.write_text(render_rules())
    on = '{__name__="specdeploy_engine_info",host="%s",spec_tokens="2"}'
    series = []
    # gpu-a: the gate's step ratio says 1.2x, the measured price at its load says 0.9x: re-gated
    # gpu-b: no surface: the gate's step ratio decides (1.2x): left alone
    # gpu-c: the gate's step ratio says 0.9x, the measured price at its load 1.29x: left alone
    for host, live, ratio, needed in (("gpu-a", 1.8, 1.5, 2.0), ("gpu-b", 1.8, 1.5, None),
                                      ("gpu-c", 1.8, 2.0, 1.4)):
        series += [{"series": on % host, "values": "1x15"},
                   {"series": f'specdeploy_spec_acceptance_length{{host="{host}"}}', "values": f"{live}x15"},
                   {"series": f'specdeploy_gate_step_ratio{{host="{host}",concurrency="1"}}', "values": f"{ratio}x15"}]
        if needed:
            series.append({"series": f'specdeploy_surface_needed_acceptance_length_now{{host="{host}"}}',
                           "values": f"{needed}x15"})
    tests = {"rule_files": [str(rules)], "evaluation_interval": "1m",
             "group_eval_order": ["specdeploy.recording", "specdeploy.alerts"],
             "tests": [{"interval": "1m", "input_series": series,
                        "promql_expr_test": [{"expr": "specdeploy:spec_predicted_speedup", "eval_time": "2m",
                                              "exp_samples": [{"labels": f'{RECORD}{{host="{h}"}}', "value": v}
                                                              for h, v in (("gpu-a", 0.9), ("gpu-b", 1.2),
                                                                           ("gpu-c", 1.8 / 1.4))]}],
                        "alert_rule_test": [{"eval_time": "12m", "alertname": "SpecdeploySpeculationBelowBreakeven",
                                             "exp_alerts": [{"exp_labels": {"severity": "warning", "host": "gpu-a",
                                                                            "specdeploy_action": "regate"},
                                                             "exp_annotations": ANNOTATIONS}]}]}]}
    tf = tmp_path / "rules_test.yml"
    tf.write_text(yaml.safe_dump(tests, sort_keys=False))
    r = subprocess.run(["promtool", "test", "rules", str(tf)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_gate_report_gets_the_al_each_levels_band_needs_and_names_levels_below_it():
    report = {"k": 2, "speculation": True, "levels": [
        {"concurrency": 1, "acceptance_length": 1.7, "speedup": 1.2},
        {"concurrency": 8, "acceptance_length": 1.9, "speedup": 0.85}]}
    S.add_to_report(report, _surface())
    a, b = report["levels"]
    assert a["surface_needed_al"] == pytest.approx([1.4, 1.54]) and a["surface_speedup"] == pytest.approx(1.7 / 1.4)
    assert b["surface_needed_al"][0] == pytest.approx(2.2) and b["surface_speedup"] == pytest.approx(1.9 / 2.2)
    assert report["surface"]["used"] and report["surface"]["below_breakeven_at"] == [8]
    other = {"k": 4, "speculation": True, "levels": [{"concurrency": 1, "acceptance_length": 2.0}]}
    S.add_to_report(other, _surface())
    assert not other["surface"]["used"] and "k=4" in other["surface"]["why"]
    assert "surface_needed_al" not in other["levels"][0]


def test_gate_refuses_a_bad_surface_before_it_measures_anything(tmp_path):
    bad = tmp_path / "surface.json"
    bad.write_text(json.dumps({"kind": "something else"}))
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "gate", "--engine", "vllm", "--url",
                        "http://127.0.0.1:9", "--surface", str(bad), "--out", str(tmp_path / "gate")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--surface" in r.stderr and "not a speculation surface" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "gate").exists()
