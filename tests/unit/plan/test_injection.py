"""No variable breaks out of the line it is written on: control characters are refused by the schema for every
string variable, every rendered unit passes `systemd-analyze verify`, and hostile printable values come back
from the unit, env file, argv file and scrape config exactly as given."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import typing

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from unitcheck import exec_argv, have_analyze, unit_exec, verify

from specdeploy.values.errors import SpecdeployError
from specdeploy.plan import engine_command, render_host
from specdeploy.plan.render import runtime
from specdeploy.plan.render.prometheus import render_prometheus
from specdeploy.plan.render.quoting import parse_env_file
from specdeploy.plan.render.systemd import render_router
from specdeploy.hostvars.schema import FIELDS, validate_host

BASE = {"specdeploy_engine": "vllm", "specdeploy_engine_version": "0.16.0", "specdeploy_hardware": "h200_nvl8",
        "specdeploy_model_path": "/models/m", "specdeploy_spec_enabled": True, "specdeploy_drafter_path": "/models/d"}
CUSTOM = {"gpu_count": 8, "gpu_memory_gib": 96, "compute_capability": "12.0", "interconnect": "pcie"}
needs_analyze = pytest.mark.skipif(not have_analyze(), reason="systemd-analyze is not installed")


def cli(*args):
    return subprocess.run([sys.executable, "-m", "specdeploy.cli", *args], capture_output=True, text=True)


def refused(variables: dict, subject: str, words: str = "") -> SpecdeployError:
    with pytest.raises(SpecdeployError) as ei:
        validate_host("h", {**BASE, **variables})
    subjects = {p.subject for p in ei.value.problems}
    assert any(s == subject or s.startswith(subject + ".") for s in subjects), ei.value
    assert all(p.fix for p in ei.value.problems)
    assert words in str(ei.value)
    return ei.value


# ---- the findings of the review, one by one ---------------------------------------------------------------------

def test_newline_in_start_timeout_cannot_add_a_unit_line(repo, tmp_path):
    evil = {"specdeploy_start_timeout": '10h\nExecStartPre=/bin/sh -c "id > /tmp/pwn"'}
    r = cli("plan", "-i", str(repo / "inventory/example"), "-e", json.dumps(evil), "--out", str(tmp_path / "o"))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "specdeploy_start_timeout" in r.stderr and "control character" in r.stderr and "Fix:" in r.stderr
    assert not (tmp_path / "o").exists()
    refused({"specdeploy_start_timeout": "10h; id"}, "specdeploy_start_timeout", "time span")


@pytest.mark.parametrize("var,value", [
    ("specdeploy_model_path", "/models/m\nExecStartPre=/bin/id"),
    ("specdeploy_served_model_name", "kimi\r\nUser=root"),
    ("specdeploy_bind_address", "0.0.0.0\n"),
    ("specdeploy_engine_env", {"FOO": "a\nExecStartPre=/bin/id"}),
    ("specdeploy_engine_env", {"FOO\nBAR": "a"}),
    ("specdeploy_engine_extra_args", ["--max-num-seqs", "8\t"]),
    ("specdeploy_spec_config_extra", {"k": ["a\x7f"]}),
])
def test_control_characters_are_refused_naming_the_variable(repo, tmp_path, var, value):
    refused({var: value}, var, "control character")
    r = cli("plan", "-i", str(repo / "inventory/example"), "-e", json.dumps({var: value}), "--out",
            str(tmp_path / "o"))
    assert r.returncode == 2 and f"ERROR gpu-a: {var}" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


def test_a_quote_in_ansible_host_is_refused_and_the_scrape_config_is_yaml_safe(repo):
    refused({"ansible_host": '10.0.0.1"], labels: {x: "y'}, "ansible_host", "not a host name")
    refused({"ansible_host": "10.0.0.1 # x"}, "ansible_host")
    validate_host("h", {**BASE, "ansible_host": "fe80::1%eth0"})
    validate_host("h", {**BASE, "ansible_host": "gpu-a.example.internal"})
    # whatever reaches the renderer is data, never YAML syntax
    hostile = ['a"], b: [c', "x: {y: z}", "#c", "'q'", "é ü", "&anchor *ref !tag", "- item"]
    targets = [{"host": h, "address": h, "engine": h, "engine_port": 1, "exporter_port": 2} for h in hostile]
    doc = yaml.safe_load(render_prometheus(targets, rules_files=["/r/a b.yml", "x: y"], scrape_interval="15s"))
    jobs = {j["job_name"]: j["static_configs"] for j in doc["scrape_configs"]}
    assert [c["labels"]["host"] for c in jobs["specdeploy_engine"]] == hostile
    assert [c["targets"] for c in jobs["specdeploy_exporter"]] == [[f"{h}:2"] for h in hostile]
    assert doc["rule_files"] == ["/r/a b.yml", "x: y"] and doc["global"]["scrape_interval"] == "15s"


@pytest.mark.parametrize("var,value,words", [
    ("specdeploy_model_path", "", "absolute"),
    ("specdeploy_model_path", "models/m", "absolute"),
    ("specdeploy_drafter_path", "drafter", "absolute"),
    ("specdeploy_venv_path", "venv", "absolute"),
    ("specdeploy_model_path", "/models/a:b", "':'"),
    ("specdeploy_drafter_path", "/d:ro", "':'"),
    ("specdeploy_exporter_port", 8000, "also specdeploy_port"),
    ("specdeploy_engine_extra_args", ["--port", "9000"], "set by specdeploy"),
    ("specdeploy_engine_extra_args", ["--served-model-name=x"], "set by specdeploy"),
    ("specdeploy_engine_env", {"A B": "c"}, "not an environment variable name"),
    ("specdeploy_engine_env", {"A=B": "c"}, "not an environment variable name"),
])
def test_silently_accepted_values_are_refused(var, value, words):
    refused({var: value}, var, words)


def test_bad_engine_env_fails_in_preflight_not_later_in_plan(repo, tmp_path):
    """Preflight and plan validate through the same schema: the value preflight accepts, plan renders."""
    r = cli("plan", "-i", str(repo / "inventory/example"), "-e",
            json.dumps({"specdeploy_engine_env": {"X": "a\nb"}}), "--json")
    assert r.returncode == 2 and "specdeploy_engine_env" in r.stderr and "Traceback" not in r.stderr
    from specdeploy.checks.preflight import preflight
    for evil in ({"X": "a\nb"}, {"X\n": "b"}, {"A B": "c"}):
        reports = preflight(str(repo / "inventory/example"), extra={"specdeploy_engine_env": evil})
        errors = [f for f in reports["gpu-a"].findings if f.severity == "error"]
        assert errors and all(f.subject == "specdeploy_engine_env" for f in errors), errors


def test_ansible_shell_tasks_quote_every_value(repo):
    """In the roles' shell: scripts, every {{ expression }} is quoted for the shell (| quote), or is a constant
    the schema restricts (engine names, versions, ports), or a script the core writes."""
    allowed = re.compile(r"^('' \| specdeploy_gather_script)$")
    found = []
    for f in sorted((repo / "ansible/roles").glob("*/tasks/*.yml")):
        for task in _tasks(yaml.safe_load(f.read_text()) or []):
            for mod in ("ansible.builtin.shell", "shell"):
                text = task.get(mod)
                text = text.get("cmd") if isinstance(text, dict) else text
                if not isinstance(text, str):
                    continue
                for expr in re.findall(r"\{\{(.*?)\}\}", text, re.S):
                    e = " ".join(expr.split())
                    if not (e.endswith("| quote") or allowed.match(e)):
                        found.append(f"{f.relative_to(repo)}: {{{{ {e} }}}}")
    assert not found, "\n".join(found)


def _tasks(items):
    for t in items if isinstance(items, list) else []:
        if isinstance(t, dict):
            yield t
            for k in ("block", "rescue", "always"):
                yield from _tasks(t.get(k))


# ---- every unit systemd would read --------------------------------------------------------------------------------

def _units(hv) -> dict[str, str]:
    p = render_host("h", hv)
    return {path.rsplit("/", 1)[1]: text for path, text in p.files.items() if path.endswith(".service")}


VARIANTS = [
    {},
    {"specdeploy_runtime": "venv"},
    {"specdeploy_runtime": "venv", "specdeploy_sandbox": True},
    {"specdeploy_api_key_file": "/k"},
    {"specdeploy_runtime": "venv", "specdeploy_api_key_file": "/k"},
    {"specdeploy_engine": "sglang", "specdeploy_engine_version": "0.5.23", "specdeploy_api_key_file": "/k"},
    {"specdeploy_engine": "sglang", "specdeploy_engine_version": "0.5.23", "specdeploy_runtime": "venv",
     "specdeploy_api_key_file": "/k"},
    {"specdeploy_hardware": "custom", "specdeploy_hardware_custom": CUSTOM, "specdeploy_start_timeout": "2h 30min"},
]


@needs_analyze
@pytest.mark.parametrize("over", VARIANTS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_every_rendered_unit_passes_systemd_analyze_verify(over, tmp_path):
    units = _units(validate_host("h", {**BASE, **over}))
    assert verify(units, tmp_path) == ""  # no warning either


@needs_analyze
def test_the_router_unit_passes_verify(tmp_path):
    unit = render_router(["http://10.0.0.1:8000", "http://[fe80::1]:8000"], 30080, "/opt/specdeploy venv")
    assert verify({"specdeploy-router.service": unit}, tmp_path) == ""
    assert exec_argv(unit_exec(unit))[0] == "/opt/specdeploy venv/bin/python"


@needs_analyze
def test_verify_catches_a_broken_unit(tmp_path):
    """The check itself: a unit with a broken line or an unknown key is not passed."""
    with pytest.raises(AssertionError):
        verify({"x.service": '[Service]\nExecStart=/bin/true "a\n'}, tmp_path / "a")
    assert "Unknown key" in verify({"y.service": "[Service]\nExecStart=/bin/true\nFoo=1\n"}, tmp_path / "b")


def test_hardening_by_runtime():
    docker = _units(validate_host("h", BASE))["specdeploy-vllm.service"]
    venv = _units(validate_host("h", {**BASE, "specdeploy_runtime": "venv"}))["specdeploy-vllm.service"]
    for unit in (docker, venv):
        for line in ("NoNewPrivileges=yes", "ProtectKernelModules=yes", "RestrictNamespaces=yes",
                     "CapabilityBoundingSet=", "SystemCallArchitectures=native"):
            assert f"\n{line}\n" in unit
    # the venv engine touches the GPUs and writes its caches and JIT code itself
    for line in ("PrivateDevices=", "ProtectClock=", "MemoryDenyWriteExecute=", "ProtectSystem=strict",
                 "RestrictAddressFamilies="):
        assert f"\n{line}" not in venv
    assert "\nProtectSystem=full\n" in venv
    # the docker CLI alone runs in the docker runtime's unit
    for line in ("PrivateDevices=yes", "ProtectSystem=strict", "MemoryDenyWriteExecute=yes"):
        assert f"\n{line}\n" in docker
    assert docker.count("\nProtectSystem=") == 1


# ---- properties over every string variable ------------------------------------------------------------------------

def _string_fields() -> list[str]:
    def has_str(t) -> bool:
        return t is str or any(has_str(a) for a in typing.get_args(t)) or t is typing.Any or (
            isinstance(t, type) and t.__name__ == "CustomHardware")
    return [n for n, f in FIELDS.items() if has_str(f.annotation) or "Literal" in repr(f.annotation)]


STRING_FIELDS = _string_fields()


def _shaped(name: str, s: str, where: int):
    """``s`` where field ``name`` carries a string: itself, a list item, a dict key or value, a custom field."""
    ann = repr(FIELDS[name].annotation)
    if "CustomHardware" in ann:
        return {**CUSTOM, "description": s} if where % 2 else {**CUSTOM, "nccl_env": {"NCCL_X": s}}
    if ann.startswith("dict") or "dict[" in ann:
        return {"K": s} if where % 2 else {s: "v"}
    if "list" in ann:
        return ["--max-num-seqs", s]
    return s


CONTROL = st.sampled_from([chr(c) for c in [*range(0x20), 0x7f, 0x85, 0x9b]] + ["\u2028", "\u2029"])
PRINTABLE = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), max_size=12)


def test_every_string_variable_is_covered():
    assert len(STRING_FIELDS) >= 30
    for n in ("specdeploy_start_timeout", "specdeploy_engine_env", "specdeploy_engine_extra_args",
              "specdeploy_hardware_custom", "specdeploy_spec_config_extra", "specdeploy_runtime"):
        assert n in STRING_FIELDS


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(STRING_FIELDS), head=PRINTABLE, ctl=CONTROL, tail=PRINTABLE, where=st.integers(0, 1))
def test_property_control_characters_are_refused_for_every_string_variable(name, head, ctl, tail, where):
    s = head + ctl + tail
    with pytest.raises(SpecdeployError) as ei:
        validate_host("h", {**BASE, name: _shaped(name, s, where)})
    (p,) = [p for p in ei.value.problems if "control character" in p.message]
    assert p.subject == name and "remove the control character" in p.fix


HOSTILE = st.one_of(
    st.lists(st.sampled_from(['"', "'", "$(id)", "`id`", ";", " ; ", "%", "%n", "$HOME", "${X}", "$$", "\\", "\\n",
                              " ", "é", "中文", "🙂", "#", "=", "&&", "|", "*", "{}", "\u00a0", "\u200b"]),
             min_size=1, max_size=6).map("".join),
    PRINTABLE.filter(bool))


@needs_analyze
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(v=HOSTILE, runtime_=st.sampled_from(["docker", "venv"]))
def test_property_hostile_printable_values_verify_and_round_trip(v, runtime_, tmp_path_factory):
    if "${CREDENTIALS_DIRECTORY}" in v:  # the one variable systemd expands for us on purpose
        return
    path = "/" + v.replace(":", "_")
    variables = {**BASE, "specdeploy_runtime": runtime_, "specdeploy_served_model_name": v,
                 "specdeploy_bind_address": v, "specdeploy_model_path": path, "specdeploy_venv_path": path,
                 "specdeploy_image": v, "specdeploy_engine_env": {"HOSTILE": v},
                 "specdeploy_engine_extra_args": ["--max-num-seqs", v]}
    if v == "--":  # a bare -- in the extra args would end the engine's options: refused, naming it
        with pytest.raises(SpecdeployError, match="a bare -- ends the engine's options"):
            validate_host("h", variables)
        return
    hv = validate_host("h", variables)
    p = render_host("h", hv)
    _, cmd = engine_command(hv)
    want = runtime.exec_argv(hv, cmd.argv, runtime.engine_image(hv), bool(cmd.secret_env))
    unit = p.files["/etc/systemd/system/specdeploy-vllm.service"]
    assert exec_argv(unit_exec(unit)) == want
    for flag in ("--served-model-name", "--host", "--max-num-seqs"):
        assert want[want.index(flag) + 1] == v
    exporter = p.files["/etc/systemd/system/specdeploy-exporter.service"]
    assert exec_argv(unit_exec(exporter))[0] == f"{path}/bin/specdeploy"
    env = parse_env_file(p.files["/etc/specdeploy/specdeploy-vllm.env"], runtime_ if runtime_ == "docker"
                         else "systemd")
    assert env["HOSTILE"] == v
    argv_file = p.files["/etc/specdeploy/specdeploy-vllm.argv"]
    assert shlex.split(argv_file) == cmd.argv
    assert verify({"specdeploy-vllm.service": unit, "specdeploy-exporter.service": exporter},
                  tmp_path_factory.mktemp("u")) == ""
