"""The deploy play's last task drops the largest per-host results from the controller (ansible/deploy.yml, "Forget
this host's plans..."; docs/fleet.md). That is safe only while nothing that runs after it reads them: the later
plays, every role they reach, and the handlers that flush when the deploy play ends. These tests fail when a later
task starts to read a forgotten variable, or when the list names a variable that nothing sets any more."""
import re

import yaml

from helpers import REPO

ANSIBLE = REPO / "ansible"
FORGET = "Forget this host's plans"


def _plays():
    return yaml.safe_load((ANSIBLE / "deploy.yml").read_text())


def _deploy_play_index(plays):
    hits = [i for i, p in enumerate(plays)
            if any(str(t.get("name", "")).startswith(FORGET) for t in p.get("post_tasks") or [])]
    assert len(hits) == 1, f"exactly one play of deploy.yml ends with the '{FORGET}...' task"
    return hits[0]


def _forget_task(play):
    tasks = play["post_tasks"]
    assert str(tasks[-1].get("name", "")).startswith(FORGET), "the forget task is the play's last post task"
    return tasks[-1]


def _roles_named(node) -> set[str]:
    """Role names a play or task file reaches directly (roles:, include_role, import_role)."""
    found: set[str] = set()

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "roles" and isinstance(v, list):
                    found.update(r if isinstance(r, str) else r.get("role") or r.get("name") for r in v)
                elif k in ("ansible.builtin.include_role", "ansible.builtin.import_role", "include_role",
                           "import_role") and isinstance(v, dict):
                    found.add(v["name"])
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(node)
    return {r for r in found if r}


def _role_closure(names: set[str]) -> set[str]:
    todo, seen = set(names), set()
    while todo:
        role = todo.pop()
        seen.add(role)
        for f in (ANSIBLE / "roles" / role).rglob("*.yml"):
            doc = yaml.safe_load(f.read_text())
            more = _roles_named(doc)
            if f.name == "main.yml" and f.parent.name == "meta":
                deps = (doc or {}).get("dependencies") or []
                more |= {d if isinstance(d, str) else d.get("role") for d in deps}
            todo |= {r for r in more if r and r not in seen}
    return seen


def _later_text(plays, idx) -> dict[str, str]:
    """What runs after the forget task, as text by where it comes from."""
    out = {f"deploy.yml play {i} ({p.get('name')})": yaml.safe_dump(p) for i, p in enumerate(plays) if i > idx}
    later_roles = _role_closure(set().union(*(_roles_named(p) for p in plays[idx + 1:])))
    for role in sorted(later_roles):
        for f in sorted((ANSIBLE / "roles" / role).rglob("*")):
            if f.is_file() and "argument_specs" not in f.name:  # argument specs describe, they read nothing
                out[str(f.relative_to(REPO))] = f.read_text(errors="replace")
    # handlers notified during the deploy play flush when it ends, after its post tasks
    for role in sorted(_role_closure(_roles_named(plays[idx]))):
        h = ANSIBLE / "roles" / role / "handlers"
        for f in sorted(h.rglob("*.yml")) if h.is_dir() else []:
            out[str(f.relative_to(REPO))] = f.read_text()
    return out


def test_the_forget_task_nulls_each_variable_and_runs_whatever_the_tags():
    plays = _plays()
    task = _forget_task(plays[_deploy_play_index(plays)])
    facts = task["ansible.builtin.set_fact"]
    assert facts and all(v is None for v in facts.values())
    assert "always" in task.get("tags", [])
    assert not task.get("when"), "it runs for every host of the batch"


def test_nothing_after_the_forget_task_reads_a_forgotten_variable():
    plays = _plays()
    idx = _deploy_play_index(plays)
    names = list(_forget_task(plays[idx])["ansible.builtin.set_fact"])
    later = _later_text(plays, idx)
    assert any("roles/router" in k for k in later) and any("roles/monitoring" in k for k in later), \
        "the later plays' roles are scanned"
    readers = {n: sorted(k for k, text in later.items() if re.search(rf"\b{re.escape(n)}\b", text)) for n in names}
    assert not any(readers.values()), f"read after the deploy play forgets them: {readers}"
    # nor by the core's filters, which read hostvars by name
    core = "\n".join(p.read_text() for p in (REPO / "src/specdeploy").rglob("*.py"))
    assert not [n for n in names if re.search(rf"\b{re.escape(n)}\b", core)]


def test_each_forgotten_variable_is_set_before_the_forget_task():
    """Stale names would make the list lie about what it frees."""
    plays = _plays()
    idx = _deploy_play_index(plays)
    names = list(_forget_task(plays[idx])["ansible.builtin.set_fact"])
    earlier = [yaml.safe_dump(p) for p in plays[:idx]]
    earlier.append(yaml.safe_dump({k: v for k, v in plays[idx].items() if k != "post_tasks"}))
    for role in _role_closure(_roles_named({k: v for k, v in plays[idx].items() if k != "post_tasks"})):
        earlier += [f.read_text() for f in (ANSIBLE / "roles" / role / "tasks").rglob("*.yml")]
    text = "\n".join(earlier)
    for n in names:
        assert re.search(rf"register: {re.escape(n)}\b|^\s*{re.escape(n)}:", text, re.M), f"nothing sets {n}"


def test_the_scan_finds_a_reader_where_there_is_one():
    """The check can fail: the router's drain tasks read router_worker_url, which a scan of the later plays
    finds."""
    plays = _plays()
    later = _later_text(plays, _deploy_play_index(plays))
    assert any(re.search(r"\brouter_worker_url\b", t) for t in later.values())
