import subprocess
import sys

import pytest
import yaml

from specdeploy.values.errors import SpecdeployError
from specdeploy.hostvars.inventory import load, parse_extra_vars
from specdeploy.hostvars.schema import FIELDS, validate_host
from specdeploy.hostvars.schema_docs import ROLE_VARS, argument_specs, variables_markdown

BASE = {"specdeploy_engine": "vllm", "specdeploy_engine_version": "0.16.0",
        "specdeploy_hardware": "rtx_pro_6000_pcie", "specdeploy_model_path": "/models/k"}


def test_example_inventory_reads_through_ansible(repo):
    inv = load(repo / "inventory" / "example")
    names = [h.name for h in inv.engine_hosts]
    assert names == ["gpu-a", "gpu-b"]
    assert inv.monitoring_hosts == ["mon-1"]
    a = inv.host("gpu-a").hv
    assert a.tp == 8 and a.specdeploy_spec_enabled and a.specdeploy_engine_version == "0.16.0"
    # {{ inventory_dir }} is templated the way ansible-playbook would
    assert a.specdeploy_api_key_file.endswith("inventory/example/../../secrets/example-api-key")
    # host_vars win over group_vars
    assert inv.host("gpu-b").hv.specdeploy_nccl_env == {"NCCL_P2P_LEVEL": "SYS"}
    assert inv.host("gpu-a").hv.specdeploy_nccl_env is None


def test_extra_vars_override_like_ansible(repo):
    inv = load(repo / "inventory" / "example", extra=parse_extra_vars(["specdeploy_tensor_parallel_size=4"]))
    assert all(h.hv.tp == 4 for h in inv.engine_hosts)


@pytest.mark.parametrize("override,subject,needle", [
    ({"specdeploy_engine": "trtllm"}, "specdeploy_engine", "'vllm' or 'sglang'"),
    ({"specdeploy_tensor_parallel_size": 16}, "specdeploy_tensor_parallel_size", "larger than the 8 GPUs"),
    ({"specdeploy_spec_enabled": True}, "specdeploy_drafter_path", "no drafter"),
    ({"specdeploy_port": "http"}, "specdeploy_port", "valid integer"),
    ({"specdeploy_tp": 8}, "specdeploy_tp", "unknown variable"),
    ({"specdeploy_engine_version": "0.15.1"}, "specdeploy_engine_version", "supported: 0.16.0"),
    ({"specdeploy_spec_config_extra": {"disable_by_batch_size": 4}, "specdeploy_engine_version": "0.17.1"},
     "specdeploy_spec_config_extra.disable_by_batch_size", "removed in vLLM 0.17.0"),
])
def test_bad_input_names_host_variable_and_fix(override, subject, needle):
    with pytest.raises(SpecdeployError) as ei:
        validate_host("gpu-x", {**BASE, **override})
    lines = [p for p in ei.value.problems if p.subject == subject]
    assert lines, ei.value
    assert needle in lines[0].message
    assert lines[0].host == "gpu-x" and lines[0].fix


def test_non_specdeploy_vars_are_ignored():
    hv = validate_host("h", {**BASE, "ansible_host": "1.2.3.4", "inventory_dir": "/x"})
    assert hv.specdeploy_engine == "vllm"


def test_cli_bad_inventory_exits_nonzero_without_traceback(example_inv):
    gv = example_inv / "group_vars" / "specdeploy_engines.yml"
    text = gv.read_text().replace("specdeploy_tensor_parallel_size: 8\n", "specdeploy_tensor_parallel_size: 12\n")
    gv.write_text(text + "specdeploy_engine_versoin: x\n")
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "plan", "-i", str(example_inv)],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "gpu-a: specdeploy_engine_versoin: unknown variable" in r.stderr
    assert "did you mean 'specdeploy_engine_version'" in r.stderr


def test_missing_inventory_is_a_clean_error(tmp_path):
    with pytest.raises(SpecdeployError) as ei:
        load(tmp_path / "nope")
    assert "does not exist" in str(ei.value)


def test_argument_specs_match_schema(repo):
    """Fails when a role's meta/argument_specs.yml drifts from the pydantic schema."""
    for role in ROLE_VARS:
        path = repo / "ansible" / "roles" / role / "meta" / "argument_specs.yml"
        on_disk = yaml.safe_load(path.read_text())
        assert on_disk == argument_specs(role), f"{path} drifted; regenerate: specdeploy schema argspec {role}"
        for name in on_disk["argument_specs"]["main"]["options"]:  # the role's own variables carry its prefix
            assert name in FIELDS or name.startswith(f"{role}_"), name


def test_role_defaults_match_schema(repo):
    from specdeploy.hostvars.schema_docs import role_defaults_yaml
    for role in ROLE_VARS:
        path = repo / "ansible" / "roles" / role / "defaults" / "main" / "schema.yml"
        assert path.read_text() == role_defaults_yaml(role), f"regenerate: specdeploy schema defaults {role}"


def test_variable_docs_match_schema(repo):
    assert (repo / "docs" / "variables.md").read_text() == variables_markdown(), \
        "regenerate: specdeploy schema docs > docs/variables.md"
    for name in FIELDS:
        assert f"`{name}`" in variables_markdown()


def test_role_defaults_pass_their_own_argument_specs(repo):
    """Ansible validates every role's arguments before it runs; the schema's own defaults (null included) must pass,
    or a deploy that leaves an optional variable unset fails at the role's first task."""
    import yaml
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    from specdeploy.hostvars.schema_docs import ROLE_VARS, argument_specs, role_defaults
    for role in ROLE_VARS:
        spec = argument_specs(role)["argument_specs"]["main"]["options"]
        sample = {"str": "x", "int": 1, "bool": True, "float": 1.0, "dict": {}, "list": [], "raw": "x"}
        required = {n: (o.get("choices") or [sample[o["type"]]])[0] for n, o in spec.items() if o.get("required")}
        # the role's own options (not schema fields) are checked against its defaults by
        # tests/unit/ansible/test_argspecs.py
        spec = {n: o for n, o in spec.items() if n in FIELDS}
        values = {n: None for n in spec if not spec[n].get("required")} | role_defaults(role) | required
        errors = [str(e) for e in ArgumentSpecValidator(spec).validate(values).errors]
        assert not errors, (role, errors)
        on_disk = yaml.safe_load((repo / f"ansible/roles/{role}/meta/argument_specs.yml").read_text())
        assert {n: o for n, o in on_disk["argument_specs"]["main"]["options"].items() if n in FIELDS} == spec
