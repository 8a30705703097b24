"""The deploy play's last task drops, as each rolling batch finishes, every per-host variable the controller would
otherwise keep for nothing: the results and facts that the converged check, the preflight and the deploy play set
for an engine host and that nothing after it reads (ansible/deploy.yml, "Forget this host's plans..."; docs/fleet.md).

That is safe only while nothing that runs after it reads them: the later plays of deploy.yml and of site.yml (which
runs verify.yml after it), every role they reach, the handlers that flush when the deploy play ends, the deploy
play's own keywords (templated again for every batch) and the core's filters. A later task that sets a variable
for every host before it reads it reads its own value, not the forgotten one. These tests fail when a later task
starts to read a forgotten variable, when the list names a variable that nothing sets, and when a variable set for
an engine host is neither forgotten nor read later."""
import functools
import re

import yaml

from helpers import REPO
from specdeploy.deploy import forking

ANSIBLE = REPO / "ansible"
FORGET = forking.FORGET_TASK


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


def _later_plays(plays, idx) -> list[dict]:
    """The plays that run after the deploy play in one ansible-playbook: deploy.yml's later plays, then the plays
    of what site.yml imports after deploy.yml."""
    out = list(plays[idx + 1:])
    site = yaml.safe_load((ANSIBLE / "site.yml").read_text())
    files = [e.get("ansible.builtin.import_playbook") or e.get("import_playbook") for e in site]
    assert "deploy.yml" in files, "site.yml imports deploy.yml"
    for f in files[files.index("deploy.yml") + 1:]:
        out += yaml.safe_load((ANSIBLE / f).read_text())
    return out


def _through_hostvars(texts) -> str:
    """What the lines of these texts read through hostvars[...]: each line from its first `hostvars[` on, since
    `x: "{{ hostvars[inventory_hostname] | f }}"` sets x and does not read another host's x."""
    return "\n".join(line[line.index("hostvars["):] for text in texts for line in text.splitlines()
                     if "hostvars[" in line)


@functools.cache
def _core_words() -> frozenset:
    """The core, the playbooks' own plugins and the templates the core renders: code that reads variables by name."""
    files = [*(REPO / "src/specdeploy").rglob("*.py"), *(ANSIBLE / "filter_plugins").glob("*.py"),
             *(ANSIBLE / "callback_plugins").glob("*.py"), *(p for p in (REPO / "templates").rglob("*") if p.is_file())]
    return _words("\n".join(p.read_text(errors="replace") for p in files))


def _readers(plays, idx, names) -> dict[str, list[str]]:
    """For each name, what may read the value this host had when the forget task ran."""
    later = _later_plays(plays, idx)
    deploy = plays[idx]
    wholesale: dict[str, str] = {}
    # role files outside the task lists (defaults, vars, handlers) are templated wherever they are read
    for role in sorted(_role_closure(set().union(*(_roles_named(p) for p in later)))):
        for f in sorted((ANSIBLE / "roles" / role).rglob("*")):
            if f.is_file() and "tasks" not in f.parts and "argument_specs" not in f.name:
                wholesale[str(f.relative_to(REPO))] = f.read_text(errors="replace")
    # handlers notified during the deploy play flush when it ends, after its post tasks
    for role in sorted(_role_closure(_roles_named(deploy))):
        h = ANSIBLE / "roles" / role / "handlers"
        for f in sorted(h.rglob("*.yml")) if h.is_dir() else []:
            wholesale[str(f.relative_to(REPO))] = f.read_text()
    # the deploy play's keywords are templated again for each rolling batch, and a task of a later batch that reads
    # another host's variable through hostvars[...] reads what that host's batch left
    wholesale["deploy.yml deploy play keywords"] = yaml.safe_dump(
        {k: v for k, v in deploy.items() if k not in ("pre_tasks", "roles", "tasks", "post_tasks")})
    deploy_text = [yaml.safe_dump(deploy)] + [f.read_text() for role in _role_closure(_roles_named(deploy))
                                               for f in (ANSIBLE / "roles" / role).rglob("*.yml")]
    wholesale["hostvars[...] in the deploy play"] = _through_hostvars(deploy_text)
    events = [(f"play '{p.get('name')}'", _play_events(p)) for p in later]
    words = {k: _words(text) for k, text in wholesale.items()}
    words["specdeploy core, plugins or templates (they read hostvars by name)"] = _core_words()
    out = {}
    for n in names:
        found = [k for k, w in words.items() if n in w]
        found += [label for label, ev in events if _first_use(ev, n) == "read"]
        out[n] = found
    return out


SET_FACT = ("ansible.builtin.set_fact", "set_fact")
INCLUDE_TASKS = ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks", "include_tasks", "import_tasks")
INCLUDE_ROLE = ("ansible.builtin.include_role", "ansible.builtin.import_role", "include_role", "import_role")
# keywords of a task that registers N which read that task's own new result, not an earlier one
OWN_RESULT = ("until", "changed_when", "failed_when", "retries", "delay")


def _load(path):
    return yaml.safe_load(path.read_text()) or []


def _role_events(role, tasks_from, conditional, out, seen_deps):
    """A role's tasks in the order they run: its dependencies (meta/main.yml) first, once per role as Ansible
    does for a dependency without parameters that differ, then its task file."""
    meta = ANSIBLE / "roles" / role / "meta" / "main.yml"
    for dep in ((_load(meta) if meta.is_file() else {}) or {}).get("dependencies") or []:
        name = dep if isinstance(dep, str) else dep.get("role")
        if name not in seen_deps:
            seen_deps.add(name)
            out.append(["read", dep, conditional])  # its vars are templated where they are read
            _role_events(name, "main.yml", conditional, out, seen_deps)
    _task_events(_load(ANSIBLE / "roles" / role / "tasks" / tasks_from), role, conditional, out, seen_deps)


def _task_events(tasks, role, conditional, out, seen_deps):
    """Each task, in order, as ('task', task, conditional): conditional when an enclosing block or include has a
    `when`, so that the task may not run at all."""
    for t in tasks or []:
        if not isinstance(t, dict):
            continue
        if "block" in t:
            out.append(["read", {k: v for k, v in t.items() if k not in ("block", "rescue", "always")}, conditional])
            inner = conditional or bool(t.get("when"))
            _task_events(t.get("block"), role, inner, out, seen_deps)
            _task_events(t.get("rescue"), role, True, out, seen_deps)
            _task_events(t.get("always"), role, inner, out, seen_deps)
            continue
        inc = next((t[k] for k in INCLUDE_TASKS if k in t), None)
        incr = next((t[k] for k in INCLUDE_ROLE if k in t), None)
        if inc is not None:
            out.append(["read", {k: v for k, v in t.items() if k not in INCLUDE_TASKS}, conditional])
            name = inc if isinstance(inc, str) else inc["file"]
            _task_events(_load(ANSIBLE / "roles" / role / "tasks" / name), role,
                         conditional or bool(t.get("when")), out, seen_deps)
        elif incr is not None:
            out.append(["read", t, conditional])
            _role_events(incr["name"], f"{incr.get('tasks_from', 'main')}".removesuffix(".yml") + ".yml",
                         conditional or bool(t.get("when")), out, seen_deps)
        else:
            out.append(["task", t, conditional])


def _play_events(play):
    """A play's tasks in the order they run: pre_tasks, roles (their dependencies first), tasks, post_tasks.
    The play's own keywords and vars come first, as reads."""
    out = [["read", {k: v for k, v in play.items() if k not in ("pre_tasks", "roles", "tasks", "post_tasks")},
            False]]
    seen = set()
    _task_events(play.get("pre_tasks"), None, False, out, seen)
    for r in play.get("roles") or []:
        name = r if isinstance(r, str) else r.get("role") or r.get("name")
        out.append(["read", r, False])
        _role_events(name, "main.yml", isinstance(r, dict) and bool(r.get("when")), out, seen)
    _task_events(play.get("tasks"), None, False, out, seen)
    _task_events(play.get("post_tasks"), None, False, out, seen)
    return out


def _words(node) -> frozenset:
    """The identifiers a node's text names (a variable name is one of them when \\bname\\b matches it)."""
    return frozenset(re.findall(r"\w+", node if isinstance(node, str) else yaml.safe_dump(node)))


def _use(event):
    """What a task event reads and sets, computed once: (words read, words its own-result keywords read,
    registered name, set_fact names)."""
    kind, node, conditional = event[:3]
    if kind == "read":
        return _words(node), frozenset(), None, frozenset()
    facts = next((node[k] for k in SET_FACT if k in node), None)
    facts = facts if isinstance(facts, dict) else {}
    main = {k: v for k, v in node.items() if k not in ("register", *SET_FACT, *OWN_RESULT)}
    main["_values"] = list(facts.values())  # a fact's new value may read the old one
    own = {k: v for k, v in node.items() if k in OWN_RESULT}
    register = node.get("register") if isinstance(node.get("register"), str) else None
    return _words(main), _words(own), register, frozenset(facts)


def _first_use(events, name):
    """'set' when the play sets `name` for every host before anything in it reads it, 'read' when it may read a
    value set before the play, None when it never names it."""
    for event in events:
        if len(event) == 3:
            event.append(_use(event))
        kind, node, conditional, (reads, own, register, facts) = event
        registers, sets_fact = register == name, name in facts
        if name in reads or (name in own and not registers):
            return "read"
        if registers and not conditional:  # a registered result is set even when the task is skipped
            return "set"
        if sets_fact and not conditional and not node.get("when"):
            return "set"
        if registers or sets_fact:
            return "read"  # set only on some paths: a later read may see the forgotten value
    return None


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
    later = [p.get("name") for p in _later_plays(plays, idx)]
    assert "Verify every engine answers a real generation" in later, "site.yml's plays after deploy.yml are read"
    assert "Monitoring" in later
    readers = {n: r for n, r in _readers(plays, idx, names).items() if r}
    assert not readers, f"read after the deploy play forgets them: {readers}"


def test_every_variable_set_for_an_engine_host_is_forgotten_or_read_later():
    """What the controller keeps per host after the deploy play is what a later task reads, and no more: a new
    registered result or fact either joins the forget task or is read afterwards."""
    plays = _plays()
    idx = _deploy_play_index(plays)
    forget = _forget_task(plays[idx])
    forgotten = set(forget["ansible.builtin.set_fact"])
    engine_plays = [p for p in plays[:idx + 1] if "specdeploy_engines" in str(p.get("hosts"))]
    assert plays[idx] in engine_plays
    nodes = [{k: v for k, v in p.items() if k != "post_tasks"} for p in engine_plays]
    nodes += [p.get("post_tasks") or [] for p in engine_plays]
    for role in _role_closure(set().union(*(_roles_named(p) for p in engine_plays))):
        nodes += [_load(f) for f in (ANSIBLE / "roles" / role / "tasks").rglob("*.yml")]
    set_names: set[str] = set()

    def walk(x):
        if isinstance(x, dict):
            if isinstance(x.get("register"), str):
                set_names.add(x["register"])
            facts = next((x[k] for k in SET_FACT if k in x), None)
            if isinstance(facts, dict) and x is not forget:
                set_names.update(k for k in facts if k != "cacheable")
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(nodes)
    assert len(set_names) > 50, "the scan finds the deploy's registered results and facts"
    kept = sorted(set_names - forgotten)
    readers = _readers(plays, idx, kept)
    dead = [n for n in kept if not readers[n]]
    assert not dead, (f"set for every engine host and read by nothing after the deploy play: {dead}; add them to "
                      f"the '{FORGET}...' task of ansible/deploy.yml")


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
    """The check can fail: the router's drain tasks read router_worker_url, the deploy play's serial reads
    deploy_rollout again for every batch, and the core reads deploy_groups."""
    plays = _plays()
    readers = _readers(plays, _deploy_play_index(plays), ["router_worker_url", "deploy_rollout", "deploy_groups"])
    assert any("Router" in r or "router" in r for r in readers["router_worker_url"]), readers
    assert "deploy.yml deploy play keywords" in readers["deploy_rollout"]
    assert any("core" in r for r in readers["deploy_groups"])


def test_a_fact_set_from_hostvars_is_not_read_through_hostvars():
    """A line that sets a fact from this host's hostvars names the fact before `hostvars[`: it is no reader of it
    (else the facts the roles set that way would stay on the controller for every host, unforgotten)."""
    text = ('engine_image_host: "{{ hostvars[inventory_hostname] | specdeploy_host(inventory_hostname) }}"\n'
            "serial: \"{{ hostvars[groups['specdeploy_changing'][0]].deploy_rollout.serial }}\"\n")
    words = _words(_through_hostvars([text]))
    assert "deploy_rollout" in words and "engine_image_host" not in words


def _events(tasks):
    return _play_events({"hosts": "all", "tasks": tasks})


def test_a_read_before_the_play_sets_the_variable_counts_and_a_read_after_does_not():
    show = {"ansible.builtin.debug": {"msg": "{{ x.stdout }}"}}
    setx = {"ansible.builtin.set_fact": {"x": 1}}
    run = {"ansible.builtin.command": "true", "register": "x", "until": "x.rc == 0", "when": "c"}
    assert _first_use(_events([show, setx]), "x") == "read"
    assert _first_use(_events([setx, show]), "x") == "set"
    assert _first_use(_events([run, show]), "x") == "set"  # registered even when skipped; until reads its own
    assert _first_use(_events([{**setx, "when": "c"}, show]), "x") == "read"  # set on some paths only
    assert _first_use(_events([{"block": [setx], "when": "c"}, show]), "x") == "read"
    assert _first_use(_events([{"ansible.builtin.set_fact": {"x": "{{ x + 1 }}"}}]), "x") == "read"
    assert _first_use(_events([show]), "y") is None
    # include order: verify.yml's role sets its plan first and registers its readiness in ready.yml, which it
    # includes before the report that reads it
    verify = yaml.safe_load((ANSIBLE / "verify.yml").read_text())[0]
    ev = _play_events(verify)
    assert _first_use(ev, "inference_engine_plan") == "set"
    assert _first_use(ev, "inference_engine_ready") == "set"
