import json
import re
import subprocess
import sys

import yaml

from specdeploy.plan import plan, write_out


def _unit_exec(unit: str) -> str:
    return re.search(r"^ExecStart=(.*)$", unit, re.M).group(1)


def test_plan_renders_engine_unit_with_exec_and_nccl_env(repo, tmp_path):
    _, plans, prom = plan(repo / "inventory" / "example")
    write_out(tmp_path, plans, prom)
    unit = (tmp_path / "gpu-a/etc/systemd/system/specdeploy-vllm.service").read_text()
    env = (tmp_path / "gpu-a/etc/specdeploy/specdeploy-vllm.env").read_text()
    exec_line = _unit_exec(unit)
    # ExecStart runs the engine command inside the patched image
    assert "--entrypoint vllm specdeploy/vllm:0.16.0-p" in exec_line
    assert "serve /models/kimi-k2.5-int4" in exec_line
    assert '"{\\"method\\":\\"eagle3\\",\\"model\\":\\"/var/lib/specdeploy/drafter/vllm\\",' in exec_line
    # the env files are read by the container alone (docker --env-file), not by systemd as well
    assert "--env-file /etc/specdeploy/specdeploy-vllm.env" in exec_line and "EnvironmentFile=" not in unit
    assert "NCCL_P2P_LEVEL=SYS" in env
    for line in ("TimeoutStartSec=infinity", "Restart=always", "LimitMEMLOCK=infinity"):
        assert line in unit
    # API key: env file (0600 on the host), never the command line
    assert "--env-file /etc/specdeploy/secrets/specdeploy-vllm.env" in exec_line
    assert "api-key" not in exec_line and "VLLM_API_KEY" not in env
    scrape = yaml.safe_load(prom)
    jobs = {j["job_name"]: j for j in scrape["scrape_configs"]}
    assert jobs["specdeploy_engine"]["static_configs"][0]["targets"] == ["10.1.230.174:8000"]
    assert jobs["specdeploy_exporter"]["static_configs"][1]["targets"] == ["10.1.230.175:9450"]


def test_tuned_nccl_env_reaches_unit_env(repo):
    _, plans, _ = plan(repo / "inventory" / "example", extra={
        "specdeploy_nccl_env": {"NCCL_PROTO": "LL,Simple", "NCCL_P2P_LEVEL": "PHB"}})
    for _, _, p in plans:
        env = p.files["/etc/specdeploy/specdeploy-vllm.env"]
        assert "NCCL_PROTO=LL,Simple" in env and "NCCL_P2P_LEVEL=PHB" in env
        assert p.nccl_source == "tuned"


def test_systemd_exec_line_round_trips_argv(repo):
    """The ExecStart line, parsed with systemd's quoting rules, gives back exactly the argv."""
    from specdeploy.plan.render.systemd import systemd_quote
    from unitcheck import exec_argv
    import shlex
    argv = ["vllm", "serve", "/m", "--speculative-config", '{"a":"b c","d":1}', "50%", "$HOME"]
    line = " ".join(systemd_quote(a) for a in argv)
    unescaped = [a.replace("%%", "%").replace("$$", "$") for a in shlex.split(line)]
    assert unescaped == argv
    # read as systemd reads it (specifiers, then words with C escapes, then variables);
    # tests/unit/plan/test_injection.py
    # draws such values for every variable that reaches a unit
    argv += [";", "a;b", "'single'", "back\\slash\\n", "$(id)", "`id`", "%n%i", "${X}", "", " lead", "é 中"]
    assert exec_argv(" ".join(systemd_quote(a) for a in argv)) == argv


def test_sglang_b200_has_no_pcie_settings(repo):
    _, plans, _ = plan(repo / "inventory" / "b200")
    (_, _, p), = plans
    assert p.argv[:3] == ["python", "-m", "sglang.launch_server"]
    assert "--disable-custom-all-reduce" not in p.argv and "--attention-backend" not in p.argv
    assert p.argv[p.argv.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert "--tp-size" in p.argv and "--tp" not in p.argv


def test_plan_json_and_out_dir(repo, tmp_path):
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "plan", "-i", str(repo / "inventory/example"),
                        "--json", "--limit", "gpu-b"], capture_output=True, text=True, check=True)
    d = json.loads(r.stdout)
    assert list(d["hosts"]) == ["gpu-b"]
    assert d["hosts"]["gpu-b"]["nccl"] == "tuned"


def test_ansible_filter_renders_same_files_as_plan(repo):
    from helpers import ansible_filters
    mod = ansible_filters()
    inv, plans, _ = plan(repo / "inventory" / "example")
    via_ansible = mod.specdeploy_plan(inv.host("gpu-a").vars, "gpu-a")
    assert via_ansible["release"] == plans[0][2].release_id()
    assert via_ansible["files"] == plans[0][2].files
    assert via_ansible["argv"] == plans[0][2].argv


def test_a_verdict_is_never_written_where_it_would_hide_the_hosts_vars_file(example_inv):
    """Ansible reads host_vars/<host>/ and ignores host_vars/<host>.yml beside it without a word: the gate's and
    the NCCL choice's files are refused there (preflight says so before the gate measures), and the inventory
    check refuses the mixed layout."""
    import shutil

    import pytest

    from specdeploy.checks.preflight import preflight
    from specdeploy.plan.render.paths import gate_vars_file, host_vars_file
    hv = example_inv / "host_vars"
    assert gate_vars_file(str(example_inv), "gpu-b") == f"{example_inv}/host_vars/gpu-b/specdeploy_gate.yml"
    # the host's variables as one file, as many inventories keep them
    shutil.move(hv / "gpu-b" / "specdeploy_nccl.yml", hv / "gpu-b.yml")
    (hv / "gpu-b").rmdir()
    for write in (lambda: gate_vars_file(str(example_inv), "gpu-b"),
                  lambda: host_vars_file(str(example_inv), "gpu-b", "specdeploy_nccl.yml")):
        with pytest.raises(ValueError, match="would make Ansible ignore that file"):
            write()
    assert gate_vars_file(str(example_inv), "gpu-b", writing=False).endswith("gpu-b/specdeploy_gate.yml")
    rep = preflight(str(example_inv))
    err = [f for f in rep["gpu-b"].findings if f.subject == "specdeploy_spec_gate"]
    assert err and err[0].severity == "error" and "move the file into host_vars/gpu-b/" in err[0].fix
    assert not [f for f in rep["gpu-a"].findings if f.subject == "specdeploy_spec_gate"]  # gpu-a has no such file
    (hv / "gpu-b").mkdir()
    (hv / "gpu-b" / "specdeploy_gate.yml").write_text("---\nspecdeploy_spec_num_tokens: 2\n")
    from specdeploy.values.errors import SpecdeployError
    with pytest.raises(SpecdeployError, match="ignores gpu-b.yml beside it"):
        preflight(str(example_inv))
