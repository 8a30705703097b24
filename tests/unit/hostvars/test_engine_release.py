"""One variable switches the engine: each engine keeps its own release (specdeploy_engine_versions, else the
release the adapter pins for the hardware), specdeploy_engine_version stays an explicit override, and preflight
says which release it chose and why."""
import json

import pytest
import yaml
from typer.testing import CliRunner

from specdeploy.checks.preflight import preflight
from specdeploy.cli import app
from specdeploy.engines import adapters, get
from specdeploy.hostvars.schema import validate_host
from specdeploy.values.errors import SpecdeployError
from specdeploy.values.hardware import PROFILES

BASE = {"specdeploy_hardware": "rtx_pro_6000_pcie", "specdeploy_model_path": "/models/m"}


def _hv(**v):
    return validate_host("h", {**BASE, **v})


@pytest.mark.parametrize("engine", [a.name for a in adapters()])
def test_without_a_pin_each_engine_gets_the_release_its_adapter_pins(engine):
    hv = _hv(specdeploy_engine=engine)
    pin = get(engine).pinned(hv.profile())
    assert hv.specdeploy_engine_version == pin.version and pin.version in get(engine).versions
    assert "the release specdeploy pins" in hv.release_choice() and pin.reason in hv.release_choice()


def test_every_profile_has_a_pin_of_every_engine_and_it_is_a_supported_release():
    for prof in PROFILES.values():
        for a in adapters():
            pin = a.pinned(prof)
            assert pin.version in a.versions and pin.reason


def test_the_per_engine_map_follows_the_engine_and_the_override_wins():
    versions = {"vllm": "0.16.0", "sglang": "0.5.10"}
    assert _hv(specdeploy_engine="vllm", specdeploy_engine_versions=versions).specdeploy_engine_version == "0.16.0"
    hv = _hv(specdeploy_engine="sglang", specdeploy_engine_versions=versions)
    assert hv.specdeploy_engine_version == "0.5.10"
    assert hv.release_choice() == "SGLang 0.5.10, from specdeploy_engine_versions.sglang"
    hv = _hv(specdeploy_engine="sglang", specdeploy_engine_versions=versions, specdeploy_engine_version="0.5.23")
    assert hv.specdeploy_engine_version == "0.5.23" and "from specdeploy_engine_version" in hv.release_choice()
    # an engine the map leaves out gets the pinned release
    hv = _hv(specdeploy_engine="sglang", specdeploy_engine_versions={"vllm": "0.16.0"})
    assert hv.specdeploy_engine_version == get("sglang").pinned(hv.profile()).version


def test_an_override_left_over_from_the_other_engine_is_named_with_the_fix():
    with pytest.raises(SpecdeployError) as e:
        _hv(specdeploy_engine="sglang", specdeploy_engine_version="0.16.0")
    (f,) = e.value.problems
    assert f.subject == "specdeploy_engine_version" and "0.16.0 is a vLLM release" in f.message
    assert "specdeploy_engine_versions" in f.fix


@pytest.mark.parametrize("versions, subject", [
    ({"vlm": "0.16.0"}, "specdeploy_engine_versions"),
    ({"vllm": "latest"}, "specdeploy_engine_versions"),
    ({"vllm": "0.15.0"}, "specdeploy_engine_versions.vllm"),  # not a release the adapter knows
])
def test_a_bad_per_engine_map_is_refused_naming_it(versions, subject):
    with pytest.raises(SpecdeployError) as e:
        _hv(specdeploy_engine="vllm", specdeploy_engine_versions=versions)
    assert any(f.subject.startswith(subject) for f in e.value.problems), e.value.problems


def test_editing_only_the_engine_line_switches_the_example_inventory(repo, example_inv):
    """The example's group_vars pin both engines: changing specdeploy_engine alone plans and preflights SGLang."""
    gv = example_inv / "group_vars" / "specdeploy_engines.yml"
    gv.write_text(gv.read_text().replace("specdeploy_engine: vllm", "specdeploy_engine: sglang"))
    reports = preflight(str(example_inv))
    for host, rep in reports.items():
        assert rep.ok, (host, rep.to_dict())
        (f,) = [f for f in rep.findings if f.subject == "engine release"]
        assert f.message == "SGLang 0.5.23, from specdeploy_engine_versions.sglang"
    r = CliRunner().invoke(app, ["plan", "-i", str(example_inv), "--json"])
    assert r.exit_code == 0, r.output
    plans = json.loads(r.output)["hosts"]
    assert {(p["engine"], p["version"]) for p in plans.values()} == {("sglang", "0.5.23")}


def test_the_pinned_defaults_serve_the_example_model_as_an_eagle3_target(repo):
    """A pin is useless if the project's own model needs a newer release: every engine's pinned release passes
    preflight on the Kimi-K2.5 example with its EAGLE-3 drafter on every hardware profile it has an inventory for."""
    gv = yaml.safe_load((repo / "inventory" / "example" / "group_vars" / "specdeploy_engines.yml").read_text())
    assert set(gv["specdeploy_engine_versions"]) == {a.name for a in adapters()}
    for a in adapters():
        reports = preflight(str(repo / "inventory" / "example"),
                            extra={"specdeploy_engine": a.name, "specdeploy_engine_versions": {}})
        for host, rep in reports.items():
            assert rep.ok, (a.name, host, [f.line() for f in rep.findings if f.severity == "error"])
            (f,) = [f for f in rep.findings if f.subject == "engine release"]
            assert "the release specdeploy pins" in f.message
