"""Nothing changed that the tool did not create: the security classes of the generative suite (a deterministic
sample of tests/robust_security.py; bench/security_sweep.py runs them all), and the rules they rest on run for
real: every writing command against system paths inside a private mount namespace (overlays on the system
directories, the root read-only; never the real /), a real SIGINT to a command in the middle of its write, a real
ansible-runner run whose whole run directory is searched for the secret values, and writers racing each other."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

import robust_cases as rc
import robust_security as rs
import robust_security_outputs as rso

REPO = rc.REPO
PER_CLASS = {"output-targets": 24, "hostile-names": 27, "terminal-control": 12, "secrets": 8, "depth-size": 26,
             "concurrency": 6}  # beyond the cover of every generator part (rs.sample)
SAMPLE = rs.sample(rs.all_cases(), PER_CLASS)


@pytest.fixture(autouse=True)
def _peers_and_locks():
    yield
    rs.close_peers()
    rso.release_locks()


@pytest.mark.parametrize("case", [pytest.param(c, id=f"{c.cls}/{c.id}") for c in SAMPLE])
def test_generated_case(case, tmp_path, monkeypatch):
    rc.count(f"security/{case.cls}")
    rs.run(case, tmp_path, monkeypatch)


def test_the_sample_covers_every_class_and_every_generator_part():
    """The sample reaches every class, every writer and target kind, every name mutation's command and
    placement, every terminal carrier and sequence, every reader; the whole product is far larger."""
    import robust_security_inputs as rsi
    every = rs.all_cases()
    assert len(every) > 4 * len(SAMPLE)
    ids = {cls: " ".join(f"-{c.id}-" for c in SAMPLE if c.cls == cls) for cls in rs.CLASSES}
    assert all(ids.values())
    assert all(f"-{w}-" in ids["output-targets"] for w in rso.WRITERS)
    assert all(f"-{k}-" in ids["output-targets"] for k in rso._target_kinds())
    assert all(f"-{c}-" in ids["hostile-names"] for c in rsi.NAME_COMMANDS)
    assert all(f"-{k}-" in ids["hostile-names"] for k in ("host", "group"))
    assert all(f"-{c}-" in ids["terminal-control"] for c in rsi._terminal_carriers())
    assert all(f"-{q}-" in ids["terminal-control"] for q in rsi.SEQUENCES)
    assert all(f"-{r}-" in ids["depth-size"] for r in rsi.READERS)
    assert sum(c.cls == "output-targets" for c in every) == len(rso.WRITERS) * len(rso._target_kinds()) - 1


# --- system paths, in a private mount namespace ---------------------------------------------------------------

def _system_sample():
    cases = rso.system_cases()
    targets = list(rso.SYSTEM_TARGETS)
    # each writer once, against a target that moves along; every target reached
    return [c for i, c in enumerate(cases) if c[1] == targets[(i // len(targets)) % len(targets)]]


@pytest.mark.parametrize("writer,target,argv", [pytest.param(*c, id=f"{c[0]}-{c[1]}") for c in _system_sample()])
def test_every_writer_refuses_system_paths_in_a_private_mount_namespace(writer, target, argv, tmp_path):
    why = rso.namespace_problem()
    assert not why, f"the test needs a private mount namespace (root and unshare, as CI has): {why}"
    rso.system_case(writer, target, argv, tmp_path)
    rc.count("security/system-paths")


# --- Ctrl-C mid-write -------------------------------------------------------------------------------------------

PAUSE = textwrap.dedent("""
    import builtins, io, os, sys, time
    ready, at = os.environ["SPECDEPLOY_TEST_READY"], os.environ["SPECDEPLOY_TEST_AT"]
    state = {"opens": 0, "done": False}
    def pause():
        if not state["done"]:
            state["done"] = True
            open(ready, "w").close()
            time.sleep(120)
    def staged(args):
        return any(".specdeploy-new-" in str(a) or ".specdeploy-old-" in str(a) for a in args)
    if at == "rename":
        for name in ("rename", "replace", "link"):
            def wrap(*a, _orig=getattr(os, name), **k):
                if staged(a):
                    pause()
                return _orig(*a, **k)
            setattr(os, name, wrap)
    else:
        real_open = builtins.open
        def opened(f, mode="r", *a, **k):
            if staged([f]) and any(c in mode for c in "wxa"):
                state["opens"] += 1
                if state["opens"] == 3:
                    pause()
            return real_open(f, mode, *a, **k)
        builtins.open = io.open = opened
    from specdeploy.cli import main
    sys.argv = ["specdeploy", *sys.argv[1:]]
    main()
""")


def _interrupted_writers(ctx: dict) -> dict[str, tuple[list[str], str]]:
    """writer -> (argv, the output it had written before: the state a Ctrl-C must leave)."""
    root = ctx["root"]
    return {"plan": (["plan", "-i", ctx["inv"], "--out", f"{root}/plan"], f"{root}/plan"),
            "tuner-csv": (["nccl", "choose", f"{root}/r.json", "--tuner-csv", f"{root}/t.csv"], f"{root}/t.csv"),
            "chart": (["nccl", "choose", f"{root}/r.json", "--chart", f"{root}/c.png"], f"{root}/c.png"),
            "host-vars": (["nccl", "choose", f"{root}/r.json", "--write-host-vars", f"{root}/hv.yml"],
                          f"{root}/hv.yml"),
            "convert": (["drafter", "convert", ctx["models"] + "/drafter", "--target", ctx["models"] + "/target",
                         "--engine", "vllm", "--out", f"{root}/conv"], f"{root}/conv"),
            "report": (["report", "--prometheus", ctx.get("peer", ""), "--range", "5m", "--out", f"{root}/r.png"],
                       f"{root}/r.png")}


# every writer stopped before its rename; the directory writers also between two files of their new output
INTERRUPTS = [(w, "rename") for w in ("plan", "tuner-csv", "chart", "host-vars", "convert", "report")] + \
    [(w, "content") for w in ("plan", "convert")]


@pytest.mark.parametrize("writer,at", INTERRUPTS)
def test_ctrl_c_mid_write_leaves_the_previous_output(writer, at, tmp_path):
    """A real SIGINT while the command writes (before its rename, or between two files of its new output)
    leaves what was there byte-identical with its mode, and no temporary file."""
    ctx = rc.scratch(tmp_path)
    rs.with_peer(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}))(ctx, None)
    Path(ctx["root"], "r.json").write_text(json.dumps(rc._tune_results()))
    Path(ctx["root"], "hv.yml").write_text("---\n# my notes\nmy_var: 1\nsecret: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n"
                                           "  3131\n")
    os.chmod(Path(ctx["root"], "hv.yml"), 0o640)
    argv, target = _interrupted_writers(ctx)[writer]
    env = rs.child_env(tmp_path / "home")
    (tmp_path / "home").mkdir()
    first = subprocess.run([sys.executable, "-m", "specdeploy.cli", *argv], env=env, cwd=tmp_path / "cwd",
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    before = rs.fingerprint(tmp_path)
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", PAUSE, *argv], cwd=tmp_path / "cwd", stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(env, SPECDEPLOY_TEST_READY=str(ready), SPECDEPLOY_TEST_AT=at))
    t0 = time.time()
    while not ready.exists() and proc.poll() is None and time.time() - t0 < 120:
        time.sleep(0.05)
    assert ready.exists(), proc.communicate()
    ready.unlink()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    rc.count("security/interrupted")
    assert proc.returncode != 0 and "Traceback" not in out + err, out + err
    after = rs.fingerprint(tmp_path)
    assert after == before, sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


# --- secrets: a real ansible-runner run -------------------------------------------------------------------------

def test_no_secret_value_on_disk_after_a_real_ansible_runner_run(tmp_path):
    """-e values under names that do not look secret, a vaulted inventory value and the API key file's
    contents: after a real run (ansible-runner, ansible-playbook, hosts that refuse the connection), no file
    under the working directory, the home directory or /dev/shm holds any of them; the -e values did reach
    ansible-playbook (the port), and the run directory holds its event log only."""
    ctx = rc.scratch(tmp_path / "tree")
    root = Path(ctx["root"])
    values = {"e": "hfTOKEN-" + os.urandom(6).hex(), "nested": "nestedVALUE-" + os.urandom(6).hex(),
              "key": "sk-APIKEY-" + os.urandom(6).hex(), "vault": "VAULTED-" + os.urandom(6).hex()}
    (root / "apikey").write_text(values["key"] + "\n")
    (root / "pw").write_text("correct horse\n")
    enc = subprocess.run(["ansible-vault", "encrypt_string", "--vault-password-file", str(root / "pw"),
                          values["vault"], "--name", "my_vaulted"], capture_output=True, text=True, timeout=120)
    assert enc.returncode == 0, enc.stderr
    gv = Path(ctx["gv"])
    data = yaml.safe_load(gv.read_text())
    data["specdeploy_api_key_file"] = str(root / "apikey")
    gv.write_text(yaml.safe_dump(data) + enc.stdout)
    home = tmp_path / "home"
    home.mkdir()
    env = rs.child_env(home)
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "verify", "-i", ctx["inv"], "--vault-password-file",
                        str(root / "pw"), "-e", f"hf_tok={values['e']}", "-e",
                        json.dumps({"cfg": {"k": values["nested"]}}), "-e", "ansible_port=1"],
                       cwd=root / "cwd", env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in out, out
    assert "port 1" in out  # ansible-playbook got the -e values
    (run_dir,) = (root / "cwd" / ".cache" / "runs").iterdir()
    assert [p.name for p in run_dir.iterdir()] == ["events.jsonl"]
    events = (run_dir / "events.jsonl").read_text()
    assert "runner_on_unreachable" in events or "UNREACHABLE" in out.upper()
    holders = {"apikey", "pw", Path(ctx["gv"]).name}  # the operator's own files hold them by design
    found = [f for f in rs.leaked(tmp_path, values.values()) if Path(f.split(": ")[0]).name not in holders]
    found += rs.leaked(Path("/dev/shm"), values.values()) if Path("/dev/shm").is_dir() else []
    assert not found, found
    assert not [v for v in values.values() if v in out]
    rc.count("security/secrets-real-run")


# --- concurrency: writers racing each other ---------------------------------------------------------------------

# each writer once, into nothing or into its own earlier output by turns (the sweep runs every pair N times)
@pytest.mark.parametrize("writer,start", [(w, ("absent", "own")[i % 2]) for i, w in enumerate(sorted(rso.RACES))])
def test_two_writers_racing_for_one_output_leave_one_whole_output(writer, start, tmp_path):
    """Two runs at once, into nothing or into their own earlier output: each ends cleanly (written, or refused
    naming the path), and what is left is one whole output (its manifest is what it holds), no temporary file."""
    rso.race(writer, start, tmp_path)
    rc.count("security/concurrency-races")


# --- what the rules keep working ----------------------------------------------------------------------------------

def test_write_host_vars_keeps_comments_and_vault_values_and_the_mode(tmp_path):
    from typer.testing import CliRunner

    from specdeploy.cli import app
    (tmp_path / "r.json").write_text(json.dumps(rc._tune_results()))
    hv = tmp_path / "gpu-a.yml"
    text = ("---\n# the operator's notes\nspecdeploy_port: 8001  # kept\nmy_secret: !vault |\n"
            "  $ANSIBLE_VAULT;1.1;AES256\n  61626364\n# a closing note\n")
    hv.write_text(text)
    hv.chmod(0o640)
    for _ in range(2):  # and a second run replaces only what the first wrote
        r = CliRunner().invoke(app, ["nccl", "choose", str(tmp_path / "r.json"), "--write-host-vars", str(hv)])
        assert r.exit_code == 0, r.output
    new = hv.read_text()
    assert new.startswith(text) and new.count("specdeploy_nccl_env:") == 1
    assert new.count("# nccl choose: specdeploy_nccl_env written by") == 1
    assert os.stat(hv).st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu-a.yml", "r.json"]


def test_own_file_outputs_are_replaced_and_foreign_ones_refused(tmp_path):
    """The mark makes an output the command's own: a second run replaces it, the same bytes without the mark
    are refused byte-identical."""
    from typer.testing import CliRunner

    from specdeploy.cli import app
    (tmp_path / "r.json").write_text(json.dumps(rc._tune_results()))
    for opt, name in (("--tuner-csv", "t.csv"), ("--chart", "c.png")):
        argv = ["nccl", "choose", str(tmp_path / "r.json"), opt, str(tmp_path / name)]
        assert CliRunner().invoke(app, argv).exit_code == 0
        first = (tmp_path / name).read_bytes()
        assert CliRunner().invoke(app, argv).exit_code == 0
        foreign = first.replace(b"specdeploy", b"someone-else")
        (tmp_path / name).write_bytes(foreign)
        r = CliRunner().invoke(app, argv)
        assert r.exit_code == 2 and "was not written by" in r.output, r.output
        assert (tmp_path / name).read_bytes() == foreign


def test_a_chart_suffix_and_an_unwritable_state_are_refused_before_any_work(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import specdeploy.speculation.report as report
    from specdeploy.cli import app
    monkeypatch.setattr(report, "render", lambda *a, **k: pytest.fail("queried Prometheus before the check"))
    r = CliRunner().invoke(app, ["report", "--prometheus", "http://127.0.0.1:9", "--out", str(tmp_path / "r.txt")])
    assert r.exit_code == 2 and ".png" in r.output
    (tmp_path / "afile").write_text("x")
    inv = rc.scratch(tmp_path / "t")["inv"]
    r = CliRunner().invoke(app, ["regate", "-i", inv, "--prometheus", "http://127.0.0.1:9", "--state",
                                 str(tmp_path / "afile" / "state.json")])
    assert r.exit_code == 2 and "--state" in r.output and "Traceback" not in r.output, r.output


def test_ctrl_c_in_gate_is_a_message_and_writes_nothing(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import specdeploy.speculation.gate as gate
    from specdeploy.cli import app

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(gate, "gate", interrupted)
    r = CliRunner().invoke(app, ["gate", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "g")])
    assert r.exit_code == 130 and "interrupted" in r.output, (r.output, r.exception)
    assert not any(tmp_path.iterdir())


def test_ipv6_addresses_reach_prometheus_and_urls_in_brackets():
    from specdeploy.ops.status import prometheus_urls
    from specdeploy.plan.render.prometheus import render_prometheus
    doc = yaml.safe_load(render_prometheus([{"host": "h", "address": "2001:db8::7", "engine": "vllm",
                                             "engine_port": 8000, "exporter_port": 9450}]))
    targets = [c["targets"][0] for j in doc["scrape_configs"] for c in j["static_configs"]]
    assert targets == ["[2001:db8::7]:8000", "[2001:db8::7]:9450", "[2001:db8::7]:9100", "[2001:db8::7]:9400"]
    assert prometheus_urls(["2001:db8::9", "10.0.0.1"], None) == ["http://[2001:db8::9]:9090",
                                                                   "http://10.0.0.1:9090"]


def _inventory(tmp_path, edit) -> str:
    ctx = rc.scratch(tmp_path)
    edit(Path(ctx["inv"]), ctx)
    return ctx["inv"]


def _gv(name, text):
    def edit(inv, ctx):
        (inv / "group_vars" / name).write_text(text)
    return edit


@pytest.mark.parametrize("label,edit,words", [
    ("yml-beside-yaml", _gv("specdeploy_engines.yaml", "specdeploy_port: 8001\n"), "ignores the rest"),
    ("reserved-groups", _gv("all.yml", "groups: {}\n"), "reserves"),
    ("reserved-inventory-dir", _gv("all.yml", "inventory_dir: /tmp\n"), "reserves"),
    ("bool-port", lambda inv, ctx: _hv_b(inv).write_text("specdeploy_port: true\n"), "boolean"),
    ("zoned-ipv6", lambda inv, ctx: _hv_b(inv).write_text("ansible_host: fe80::1%eth0\n"), "zone"),
    ("two-groups-two-engines", lambda inv, ctx: _two_groups(inv), "two values"),
])
def test_inventory_conflicts_are_refused_by_preflight_and_plan(label, edit, words, tmp_path):
    from typer.testing import CliRunner

    from specdeploy.cli import app
    inv = _inventory(tmp_path, edit)
    for argv in (["preflight", "-i", inv], ["plan", "-i", inv, "--json"]):
        r = CliRunner().invoke(app, argv)
        assert r.exit_code != 0 and words in r.output and "Traceback" not in r.output, (argv, r.output)


def _hv_b(inv):
    """gpu-b's host_vars file in the example inventory (a directory: host_vars/gpu-b/)."""
    return inv / "host_vars" / "gpu-b" / "specdeploy_nccl.yml"


def _two_groups(inv: Path) -> None:
    data = yaml.safe_load((inv / "hosts.yml").read_text())
    eng = data["all"]["children"]["specdeploy_engines"]
    eng["children"] = {"team_a": {"hosts": {"gpu-a": None}}, "team_b": {"hosts": {"gpu-a": None}}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(data))
    (inv / "group_vars" / "team_a.yml").write_text("specdeploy_engine: vllm\n")
    (inv / "group_vars" / "team_b.yml").write_text("specdeploy_engine: sglang\n")


def test_named_warnings_for_what_reaches_no_host(tmp_path):
    from typer.testing import CliRunner

    from specdeploy.cli import app

    def edit(inv, ctx):
        (inv / "host_vars" / "gpu-z.yml").write_text("specdeploy_port: 8001\n")
        data = yaml.safe_load((inv / "hosts.yml").read_text())
        data["all"]["children"]["specdeploy_engines"]["hosts"]["GPU-A"] = {"ansible_host": "127.0.0.1"}
        (inv / "hosts.yml").write_text(yaml.safe_dump(data))
    inv = _inventory(tmp_path, edit)
    r = CliRunner().invoke(app, ["preflight", "-i", inv])
    for words in ("gpu-z", "reach no host", "differ only in case", "both reach 127.0.0.1"):
        assert words in r.output, (words, r.output)


def test_preflight_refuses_the_serving_group_errors_plan_refuses(tmp_path):
    from typer.testing import CliRunner

    from specdeploy.cli import app
    inv = _inventory(tmp_path, _gv("all.yml", "specdeploy_group: kimi\n"))
    for argv in (["preflight", "-i", inv], ["plan", "-i", inv, "--json"]):
        r = CliRunner().invoke(app, argv)
        assert r.exit_code != 0 and "specdeploy_group kimi" in r.output, (argv, r.output)


def test_the_run_directories_are_pruned_to_the_newest(tmp_path):
    from specdeploy.ops.runner import KEEP_RUNS, new_run_dir
    base = tmp_path / "runs"
    base.mkdir()
    for i in range(KEEP_RUNS + 5):
        d = base / f"2020010{i // 10}T0000{i % 10:02d}Z-deploy"
        d.mkdir()
        (d / "events.jsonl").write_text("{}\n")
    (base / "20200101T000000Z-deploy-mine").mkdir()  # not a name specdeploy makes: kept
    (base / "20190101T000000Z-verify").mkdir()
    (base / "20190101T000000Z-verify" / "notes.txt").write_text("someone's")  # holds more than a run: kept
    new_run_dir(base, "verify")
    runs = sorted(p.name for p in base.iterdir())
    assert "20200101T000000Z-deploy-mine" in runs and "20190101T000000Z-verify" in runs
    made = [r for r in runs if r.endswith(("-deploy", "-verify")) and r != "20190101T000000Z-verify"]
    assert len(made) == KEEP_RUNS
    shutil.rmtree(base)


def test_a_non_numeric_position_label_is_not_a_position():
    """An engine's /metrics with a position label that is not a number: the sample keeps the numeric positions
    (the gate sorts them as numbers) and drops the rest, never a ValueError."""
    from specdeploy.speculation.exporter import parse_engine_metrics
    name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    text = (f"# TYPE {name.removesuffix('_total')} counter\n" + "".join(
        f'{name}{{position="{p}"}} {v}\n' for p, v in (("0", 5), ("1", 3), ("abc", 9), ("\u0661", 2), ("-1", 1))))
    s = parse_engine_metrics("vllm", text, 0.0)
    assert sorted(s.per_pos, key=int) == ["0", "1"]


def test_a_vault_password_script_that_never_answers_is_refused_in_time(tmp_path, monkeypatch):
    import specdeploy.hostvars.inventory_ansible as ia
    from specdeploy.cli.options import vault
    from specdeploy.hostvars.inventory import load
    from specdeploy.values.errors import SpecdeployError
    monkeypatch.setattr(ia, "VAULT_SCRIPT_S", 1.0)
    ctx = rc.scratch(tmp_path / "t")
    (tmp_path / "pw").write_text("pw\n")
    enc = subprocess.run(["ansible-vault", "encrypt_string", "--vault-password-file", str(tmp_path / "pw"), "v",
                          "--name", "my_vaulted"], capture_output=True, text=True, timeout=120)
    with open(ctx["gv"], "a") as f:
        f.write(enc.stdout)
    script = tmp_path / "slow-pw"
    script.write_text("#!/bin/sh\nexec sleep 600\n")
    script.chmod(0o755)
    t0 = time.monotonic()
    with pytest.raises(SpecdeployError) as err:
        load(ctx["inv"], vault=vault(None, [str(script)]))
    assert time.monotonic() - t0 < 10 and "did not answer within 1 s" in str(err.value)


def test_extra_vars_are_rendered_as_ansible_playbook_renders_them(tmp_path):
    """A -e template is rendered in the plan as the play renders it (Ansible 2.19 renders only trusted
    templates; ansible-playbook trusts its command line), connection variables included."""
    from typer.testing import CliRunner

    from specdeploy.cli import app
    inv = rc.scratch(tmp_path)["inv"]
    r = CliRunner().invoke(app, ["plan", "-i", inv, "--json", "-e",
                                 json.dumps({"specdeploy_served_model_name": "{{ 'kimi' ~ '-' ~ 2 }}",
                                             "ansible_host": "{{ '10.0.0.' ~ 9 }}"})])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert {h["served_model_name"] for h in doc["hosts"].values()} == {"kimi-2"}
    assert "10.0.0.9:8000" in doc["prometheus"]
