"""MTP drafts with the target's own layers: whether a method uses a separate drafter is the adapter's answer, every
other place asks it; preflight refuses MTP on a target that ships no MTP layers, naming the config key."""
import json
import shutil

import pytest
from typer.testing import CliRunner

from specdeploy.checks.preflight import preflight
from specdeploy.cli import app
from specdeploy.engines import adapters
from specdeploy.plan.render.paths import converted_drafter_path

ENGINES = [a.name for a in adapters()]


def _mtp_errors(reports):
    return {h: [f for f in r.findings if f.severity == "error" and f.subject == "specdeploy_spec_method"]
            for h, r in reports.items()}


@pytest.mark.parametrize("engine", ENGINES)
def test_mtp_on_the_kimi_example_is_refused_naming_the_missing_layers(repo, engine):
    reports = preflight(str(repo / "inventory" / "example"),
                        extra={"specdeploy_engine": engine, "specdeploy_spec_method": "mtp"})
    for host, errs in _mtp_errors(reports).items():
        assert len(errs) == 1, (host, reports[host].to_dict())
        assert "num_nextn_predict_layers" in errs[0].message and "is missing" in errs[0].message
        assert not reports[host].ok
    # the drafter path the inventory still sets is not staged: said as such
    warn = [f for f in reports["gpu-a"].findings if f.subject == "specdeploy_drafter_path"]
    assert warn and warn[0].severity == "warning" and "is not used" in warn[0].message


@pytest.fixture
def deepseek_inv(example_inv, tmp_path):
    """The example inventory with a DeepSeek-V3 target that ships one MTP layer (num_nextn_predict_layers: 1)."""
    src = example_inv.parents[1] / "examples" / "models" / "kimi-k2.5-int4"
    dst = tmp_path / "deepseek-v3"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    text = cfg["text_config"]
    text.update({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                 "num_nextn_predict_layers": 1})
    (dst / "config.json").write_text(json.dumps(text))
    gv = example_inv / "group_vars" / "specdeploy_engines.yml"
    gv.write_text(gv.read_text().replace("specdeploy_model_config_copy:", f"specdeploy_model_config_copy: {dst}\n#"))
    return example_inv


@pytest.mark.parametrize("engine", ENGINES)
def test_mtp_on_a_target_with_mtp_layers_renders_no_drafter(deepseek_inv, engine):
    extra = {"specdeploy_engine": engine, "specdeploy_spec_method": "mtp"}
    reports = preflight(str(deepseek_inv), extra=extra)
    assert _mtp_errors(reports) == {h: [] for h in reports}
    # the DeepSeek-V3 config was read (a missing config would skip the check silently)
    assert not any(f.subject == "target config" for r in reports.values() for f in r.findings)
    assert all(r.ok for r in reports.values()), {h: r.to_dict() for h, r in reports.items()}
    r = CliRunner().invoke(app, ["plan", "-i", str(deepseek_inv), "--json", "-e", json.dumps(extra)])
    assert r.exit_code == 0, r.output
    for host, p in json.loads(r.output)["hosts"].items():
        assert not p["drafter_path"], host
        assert "/drafter" not in " ".join(p["argv"]) and "/models/kimi-k2.5-eagle3" not in " ".join(p["argv"])
        if engine == "vllm":
            spec = json.loads(p["argv"][p["argv"].index("--speculative-config") + 1])
            assert spec["method"] == "mtp" and "model" not in spec
        else:
            assert p["argv"][p["argv"].index("--speculative-algorithm") + 1] == "NEXTN"


def test_every_place_asks_the_adapter_whether_a_method_uses_a_drafter(repo):
    from specdeploy.hostvars.schema import validate_host
    base = {"specdeploy_hardware": "h200_nvl8", "specdeploy_model_path": "/m", "specdeploy_spec_enabled": True,
            "specdeploy_drafter_path": "/d"}
    for engine in ENGINES:
        for method in ("eagle3", "eagle", "mtp", "ngram"):
            hv = validate_host("h", {**base, "specdeploy_engine": engine, "specdeploy_spec_method": method})
            uses = method in ("eagle3", "eagle")
            assert hv.uses_drafter is uses
            assert [w["kind"] for w in hv.weights()] == (["model", "drafter"] if uses else ["model"])
            assert bool(converted_drafter_path(hv)) is uses
