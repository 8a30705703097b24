"""The Ansible side is a layer of the core: the filter plugin is a shim over specdeploy.deploy, the roles build no
host path and name no unit, the decisions they used to write as Jinja chains are functions of the core, and every
task declares its phase, which the live view reads from the real playbooks."""
import ast
import re

import pytest
import yaml

from helpers import REPO

from specdeploy.deploy import decisions
from specdeploy.deploy.filters import FILTERS
from specdeploy.ops import phases
from specdeploy.ops.fleet import Target
from specdeploy.ops.runner import Run

ROLES = REPO / "ansible" / "roles"
YAMLS = sorted((REPO / "ansible").rglob("*.yml"))


def test_the_filter_plugin_is_a_shim_of_the_deploy_package():
    f = REPO / "ansible" / "filter_plugins" / "specdeploy.py"
    code = [line for line in f.read_text().splitlines() if line.strip() and not line.strip().startswith("#")]
    assert len(code) <= 80
    imports = {n.module for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.ImportFrom)}
    assert imports == {"specdeploy.deploy.filters"}
    # every filter a playbook or role calls exists in the core
    called = set()
    for y in YAMLS:
        called |= set(re.findall(r"\|\s*(specdeploy_\w+)", y.read_text()))
    assert called and called <= set(FILTERS), called - set(FILTERS)


def _host_path_vars() -> set[str]:
    """Role variables whose default is a host path of the core (a role joining a path onto one builds a path)."""
    out = set()
    for f in ROLES.glob("*/defaults/main/*.yml"):
        for k, v in (yaml.safe_load(f.read_text()) or {}).items():
            if isinstance(v, str) and "specdeploy_path" in v:
                out.add(k)
    return out


def test_no_role_builds_a_host_path_or_names_a_unit():
    spelled, built = [], []
    path_vars = _host_path_vars()
    for y in YAMLS:
        for n, line in enumerate(y.read_text().splitlines(), 1):
            where = f"{y.relative_to(REPO)}:{n}: {line.strip()}"
            if re.search(r"/(var/lib|etc|opt|run)/specdeploy|/etc/systemd|specdeploy-[a-z]+\.service", line):
                spelled.append(where)
            # a trailing '/' (rsync: the directory's contents) joins nothing
            if re.search(r"specdeploy_path(\([^)]*\))? *}}/[^\"']|specdeploy_path(\([^)]*\))?\)? *~ *'/", line):
                built.append(where)
            for v in path_vars | {"specdeploy_venv_path", "router_venv"}:
                if re.search(rf"\b{v} *}}}}/[^\"']|\b{v} *~ *'/", line):
                    built.append(where)
    assert not spelled, "\n".join(spelled)
    assert not built, "\n".join(built)


def test_no_group_decision_is_a_jinja_chain():
    chains = [f"{y.relative_to(REPO)}" for y in YAMLS if "map('extract', hostvars" in y.read_text()]
    assert not chains, chains


@pytest.mark.parametrize("facts, mates, converged", [
    ({"a": {"deploy_self_converged": True}, "b": {"deploy_self_converged": "true"}}, ["a", "b"], True),
    ({"a": {"deploy_self_converged": True}, "b": {}}, ["a", "b"], False),  # a rank that did not check: changed
    ({"a": {"deploy_self_converged": True}, "b": {"deploy_self_converged": False}}, ["a", "b"], False),
    ({"a": {"deploy_self_converged": "yes"}}, ["a"], True),
])
def test_a_group_skips_the_deploy_only_as_a_whole(facts, mates, converged):
    assert decisions.group_converged(mates, facts) is converged


def test_a_group_restarts_as_one_unit_and_rolls_back_for_its_other_ranks():
    hv = {"lead": {"inference_engine_restart_self": False}, "f1": {"inference_engine_restart_self": True}}
    assert decisions.group_restart(["lead", "f1"], hv, "lead") == {"restart": True, "others": True}
    assert decisions.group_restart(["lead", "f1"], hv, "f1") == {"restart": True, "others": False}
    hv["f1"]["inference_engine_restart_self"] = False
    assert decisions.group_restart(["lead", "f1"], hv, "lead") == {"restart": False, "others": False}
    assert decisions.group_restart(["lead", "f2"], hv, "lead")["restart"]  # a rank with no fact yet restarts
    assert decisions.rolls_back("r1", "r2", False)
    assert not decisions.rolls_back("r2", "r2", False) and decisions.rolls_back("r2", "r2", True)
    assert not decisions.rolls_back("", "r2", True)


def test_only_a_changing_group_behind_an_api_router_drains():
    group = {"serves": True, "routed_by_api": True, "mates": ["a", "b"]}
    hv = {"a": {"deploy_changes": False}, "b": {"deploy_changes": True}}
    assert decisions.drains("sglang-router", "router-1", group, group["mates"], hv)
    assert not decisions.drains("none", "router-1", group, group["mates"], hv)
    assert not decisions.drains("sglang-router", "", group, group["mates"], hv)
    assert not decisions.drains("sglang-router", "router-1", {**group, "routed_by_api": False}, ["a", "b"], hv)
    hv["b"]["deploy_changes"] = False
    assert not decisions.drains("sglang-router", "router-1", group, group["mates"], hv)


def _task_lines(rel: str) -> dict[str, int]:
    """Task name -> line of the real task in a file of the ansible directory."""
    doc = yaml.compose((REPO / "ansible" / rel).read_text())
    out = {}

    def walk(seq):
        for t in seq.value if isinstance(seq, yaml.SequenceNode) else []:
            if isinstance(t, yaml.MappingNode):
                for k, v in t.value:
                    if k.value == "name":
                        out[v.value] = t.start_mark.line + 1
                    if k.value in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks"):
                        walk(v)
    walk(doc)
    return out


@pytest.mark.parametrize("rel, task, phase", [
    ("roles/gpu_host/tasks/main.yml", None, "provision"),
    ("roles/engine_image/tasks/main.yml", None, "image"),
    ("roles/model_store/tasks/item.yml", None, "stage"),
    ("roles/drafter/tasks/main.yml", "Convert the drafter for the engine", "stage"),
    ("roles/inference_engine/tasks/main.yml", "Start the engine, then the hosts that serve (restart when the release "
     "changed)", "start"),
    ("roles/inference_engine/tasks/ready.yml", "Readiness deadline (wall time)", "load"),
    ("roles/inference_engine/tasks/ready.yml", "Readiness result", "ready"),
    ("roles/inference_engine/tasks/rollback.yml", "Restart the release's engine", "rollback"),
    ("roles/speculation_gate/tasks/main.yml", "Baseline - measure (load from the controller)", "gate"),
    ("deploy.yml", "Preflight this host through the core", "preflight"),
])
def test_each_task_declares_its_phase_and_the_live_view_reads_it(rel, task, phase, tmp_path):
    lines = _task_lines(rel)
    line = lines[task] if task else min(lines.values())
    path = f"{REPO / 'ansible' / rel}:{line}"
    assert phases.index(REPO / "ansible").phase(path) == phase
    # as ansible-runner reports the task's start, the host's row takes the phase
    run = Run([Target("h1", "127.0.0.1", "vllm", 8000, 9450, "u", [])], tmp_path / "events.jsonl")
    run.event({"event": "runner_on_start", "event_data": {"host": "h1", "task": task or "x", "task_path": path}})
    assert run.rows["h1"].phase == phase


def test_every_task_of_the_roles_that_move_a_host_has_a_phase():
    ix = phases.index(REPO / "ansible")
    neutral = {"common", "router", "spec_exporter", "monitoring"}  # they run inside other phases
    missing = [f"{rel}:{line}" for (rel, line), p in ix.phases.items()
               if p is None and rel.startswith("roles/") and rel.split("/")[1] not in neutral]
    assert not missing, missing
