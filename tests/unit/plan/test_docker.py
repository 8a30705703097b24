"""The Docker runtime without a Docker engine: Dockerfiles, build plans, the rendered `docker run`, the env file
as docker reads it, GPU flags per hardware profile, the wheelhouse for the hosts' Python, and fail-fast
readiness. The images are built and run for real in the sandbox (tests/e2e/test_sandbox_e2e.py)."""
import re
import subprocess
import sys
import zipfile

import pytest

from specdeploy.plan.images import build_plan, image_tag
from specdeploy.engines.patches import patch_set_id


def parse(path):
    """Dockerfile -> list of (instruction, argument) with continuation lines joined."""
    out, buf = [], ""
    for line in path.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        buf += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            ins, _, arg = buf.strip().partition(" ")
            out.append((ins.upper(), arg.strip()))
            buf = ""
    return out


@pytest.mark.parametrize("engine,official", [("vllm", "vllm/vllm-openai:v${VLLM_VERSION}"),
                                             ("sglang", "lmsysorg/sglang:v${SGLANG_VERSION}")])
def test_engine_dockerfiles_build_from_a_base_argument(repo, engine, official):
    steps = parse(repo / f"docker/{engine}.Dockerfile")
    from_idx = next(k for k, (i, _) in enumerate(steps) if i == "FROM")
    before = [a for i, a in steps[:from_idx] if i == "ARG"]
    assert f"BASE_IMAGE={official}" in before  # production default: the official image
    assert steps[from_idx] == ("FROM", "${BASE_IMAGE}")
    after = [a for i, a in steps[from_idx:] if i == "ARG"]
    for a in ("PATCH_SET=none", "OFFLINE=0", "SPECDEPLOY_SOURCE=unknown"):
        assert a in after
    runs = " ".join(a for i, a in steps if i == "RUN")
    assert f'patch apply --engine {engine} --root "$SITE"' in runs
    assert "--no-index" in runs and "--find-links /opt/specdeploy-wheels" in runs
    labels = " ".join(a for i, a in steps if i == "LABEL")
    for key in (f'io.specdeploy.engine="{engine}"', 'io.specdeploy.patch-set="${PATCH_SET}"',
                'io.specdeploy.source="${SPECDEPLOY_SOURCE}"'):
        assert key in labels


def test_vllm_dockerfile_fails_on_an_incomplete_patch_set(repo):
    runs = " ".join(a for i, a in parse(repo / "docker/vllm.Dockerfile") if i == "RUN")
    assert "grep -q '\"needed\"\\|\"drift\"'" in runs
    assert 'if [ "$IMPORT_CHECK" = 1 ]' in runs and "compileall" in runs


def test_build_plan_production_and_sandbox():
    prod = build_plan("vllm", "0.16.0")
    assert prod["build_args"]["BASE_IMAGE"] == "vllm/vllm-openai:v0.16.0" and prod["sandbox"] is None
    assert "OFFLINE" not in prod["build_args"] and prod["tag"] == image_tag("vllm", "0.16.0")
    sb = build_plan("vllm", "0.16.0", sandbox=True, source="abc")
    assert sb["tag"] == prod["tag"]  # the same image name, built from the stand-in
    assert sb["build_args"] | {"BASE_IMAGE": None} == {"VLLM_VERSION": "0.16.0", "PATCH_SET": prod["patch_set"],
                                                       "BASE_IMAGE": None, "SPECDEPLOY_SOURCE": "abc",
                                                       "OFFLINE": "1", "IMPORT_CHECK": "0"}
    assert sb["build_args"]["BASE_IMAGE"] == sb["sandbox"]["tag"] == "specdeploy-sandbox/vllm-openai:v0.16.0"
    sg = build_plan("sglang", "0.5.23", sandbox=True)
    assert sg["dockerfile"] == "docker/sglang.Dockerfile" and "IMPORT_CHECK" not in sg["build_args"]


def test_image_tags_carry_version_and_patch_hash():
    t16 = image_tag("vllm", "0.16.0")
    assert re.fullmatch(r"specdeploy/vllm:0\.16\.0-p[0-9a-f]{10}", t16)
    assert image_tag("vllm", "0.17.1").endswith(patch_set_id("vllm", "0.17.1"))
    assert image_tag("vllm", "0.18.0") == "specdeploy/vllm:0.18.0-none"
    assert image_tag("vllm", "0.16.0", "none") == "specdeploy/vllm:0.16.0-none"


def _hv(**over):
    from specdeploy.hostvars.schema import validate_host
    v = {"specdeploy_engine": "vllm", "specdeploy_engine_version": "0.16.0", "specdeploy_hardware": "h200_nvl8",
         "specdeploy_model_path": "/models/m", "specdeploy_spec_enabled": True,
         "specdeploy_drafter_path": "/models/d"}
    v.update(over)
    return validate_host("h", v)


def _docker_run(argv):
    """Parse the options of a rendered `docker run` into (flags, image, command)."""
    i = argv.index("run") + 1
    opts = []
    while argv[i].startswith("-"):
        if argv[i] == "--rm":
            opts.append((argv[i], None))
            i += 1
        else:
            opts.append((argv[i], argv[i + 1]))
            i += 2
    return opts, argv[i], argv[i + 1:]


def test_gpu_flags_follow_the_hardware_profile():
    from specdeploy.plan import render_host
    gpu = render_host("h", _hv())
    unit = gpu.files["/etc/systemd/system/specdeploy-vllm.service"]
    opts, image, _ = _docker_run(re.search(r"^ExecStart=(.*)$", unit, re.M).group(1).replace('"', "").split())
    assert ("--gpus", "all") in opts and image == gpu.image
    none = render_host("h", _hv(specdeploy_sandbox=True))  # a host without GPUs
    unit = none.files["/etc/systemd/system/specdeploy-vllm.service"]
    assert "/usr/bin/docker run" in unit and "--gpus" not in unit
    assert "memlock" not in unit and "--ulimit stack=67108864" in unit  # pinned memory is for GPUs
    assert "--ulimit memlock=-1" in gpu.files["/etc/systemd/system/specdeploy-vllm.service"]
    assert none.image == gpu.image  # the sandbox runs the same image name, built on the host


def test_nccl_tuning_container_is_the_engine_container():
    """Same image, GPUs, IPC, ulimits and read-only model/drafter mounts as the engine unit."""
    from specdeploy.plan import engine_command
    from specdeploy.plan.render.runtime import exec_argv, tool_container
    hv = _hv()
    _, cmd = engine_command(hv)
    e_opts, e_image, _ = _docker_run(exec_argv(hv, cmd.argv, "img:1"))
    t = tool_container(hv, "specdeploy-nccl-tune", ["nccl", "tune", "--gpus", "8"], ("/var/lib/specdeploy/nccl",))
    t_opts, t_image, t_cmd = _docker_run(t["argv"])
    assert e_image == "img:1" and t_image.startswith("specdeploy/vllm:0.16.0-p")
    same = lambda opts: {o for o in opts if o[0] in ("--gpus", "--ipc", "--network", "--ulimit")}  # noqa: E731
    assert same(t_opts) == same(e_opts) and ("--gpus", "all") in t_opts
    vols = {v for k, v in t_opts if k == "-v"}
    assert {"/models/m:/models/m:ro", "/var/lib/specdeploy/drafter/vllm:/var/lib/specdeploy/drafter/vllm:ro",
            "/var/lib/specdeploy/nccl:/var/lib/specdeploy/nccl"} <= vols
    assert t_cmd == ["-m", "specdeploy.cli", "nccl", "tune", "--gpus", "8"]
    p = t["params"]  # the same container for community.docker.docker_container
    assert p["image"] == t_image and sorted(p["volumes"]) == sorted(vols)
    assert p["device_requests"][0]["count"] == -1 and p["ulimits"] == ["memlock:-1:-1", "stack:67108864:67108864"]
    venv = tool_container(_hv(specdeploy_runtime="venv"), "x", ["nccl", "tune"])
    assert venv["argv"] == ["/opt/specdeploy/venv/bin/specdeploy", "nccl", "tune"]


ENV = {"TORCH_CUDA_ARCH_LIST": "9.0 10.0", "QUOTED": 'say "hi"', "BACKSLASH": "a\\b", "EQ": "a=b", "EMPTY": "",
       "DOLLAR": "$HOME"}


def test_env_file_reads_the_same_in_its_consumer():
    from specdeploy.plan import render_host
    from specdeploy.plan.render.systemd import parse_env_file
    docker = render_host("h", _hv(specdeploy_engine_env=ENV)).files["/etc/specdeploy/specdeploy-vllm.env"]
    got = parse_env_file(docker, "docker")
    assert {k: got[k] for k in ENV} == ENV  # docker keeps quotes: the values are written verbatim
    assert 'TORCH_CUDA_ARCH_LIST="' not in docker
    venv = render_host("h", _hv(specdeploy_engine_env=ENV, specdeploy_runtime="venv"))
    text = venv.files["/etc/specdeploy/specdeploy-vllm.env"]
    unit = venv.files["/etc/systemd/system/specdeploy-vllm.service"]
    assert "EnvironmentFile=/etc/specdeploy/specdeploy-vllm.env" in unit
    got = parse_env_file(text, "systemd")
    assert {k: got[k] for k in ENV} == ENV
    # a newline is refused by the schema, naming the variable; the renderer refuses it again for a value that
    # did not come through the schema
    from specdeploy.values.errors import SpecdeployError
    with pytest.raises(SpecdeployError, match="specdeploy_engine_env.*newline"):
        _hv(specdeploy_engine_env={"X": "a\nb"})
    with pytest.raises(ValueError, match="newline"):
        render_host("h", _hv().model_copy(update={"specdeploy_engine_env": {"X": "a\nb"}}))


def test_wheelhouse_targets_the_hosts_python(tmp_path):
    from specdeploy.ops.wheelhouse import TargetError, target_args
    args = target_args("3.12:x86_64:2.36")
    assert args[args.index("--python-version") + 1] == "3.12" and "cp312" in args
    plats = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert "manylinux_2_36_x86_64" in plats and "manylinux_2_17_x86_64" in plats
    assert "manylinux_2_37_x86_64" not in plats
    with pytest.raises(TargetError):
        target_args("python3.12")
    # pip really fetches a binary wheel for another interpreter than the controller's
    other = "3.12" if sys.version_info[:2] != (3, 12) else "3.11"
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(tmp_path), "--only-binary=:all:",
                        *target_args(f"{other}:x86_64:2.36"), "pyyaml==6.0.2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (whl,) = tmp_path.glob("*.whl")
    assert f"cp{other.replace('.', '')}" in whl.name and "manylinux" in whl.name
    with zipfile.ZipFile(whl) as z:
        assert any(n.endswith(".so") for n in z.namelist())


def test_wheelhouse_cli_rejects_a_bad_target(tmp_path):
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "wheelhouse", "--out", str(tmp_path),
                        "--target", "3.11-x86_64"], capture_output=True, text=True)
    assert r.returncode == 2 and "ERROR --target" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("engine,version", [("vllm", "0.16.0"), ("sglang", "0.5.9")])
def test_api_key_files_are_where_the_unit_reads_them_in_the_form_the_engine_reads(engine, version, tmp_path):
    """The role writes what plan.secret_files returns; the unit (venv or docker) must point at those very files,
    and the engine (as the simulator plays it, from the same adapter) must read the key back from them."""
    from specdeploy.engines import get
    from specdeploy.plan import render_host, secret_files
    key = "k3y:with-yaml#chars{}" if engine == "sglang" else "sk-k3y:#={}"
    for runtime in ("venv", "docker"):
        hv = _hv(specdeploy_engine=engine, specdeploy_engine_version=version, specdeploy_runtime=runtime,
                 specdeploy_api_key_file=str(tmp_path / "key"))
        files = secret_files(hv, key)
        assert files and all(p.startswith("/etc/specdeploy/secrets/") for p in files)
        unit = render_host("h", hv).files[f"/etc/systemd/system/specdeploy-{engine}.service"]
        for path in files:
            assert path in unit, f"{runtime}: the unit never reads {path}"
        assert key not in unit and key not in " ".join(render_host("h", hv).argv)
        assert secret_files(_hv(specdeploy_engine=engine, specdeploy_engine_version=version), key) == {}
    sim = get(engine).simulation()
    (path, content), = files.items()
    if path.endswith(".env"):
        env = dict(line.split("=", 1) for line in content.splitlines())
        assert sim.api_key({}, env) == key
    else:
        (tmp_path / "cred").write_text(content)
        assert sim.api_key({"config": str(tmp_path / "cred")}, {}) == key


def test_an_api_key_the_env_file_readers_disagree_on_is_refused_with_the_field_and_a_fix(tmp_path):
    from specdeploy.values.errors import SpecdeployError
    from specdeploy.plan import secret_files
    hv = _hv(specdeploy_api_key_file=str(tmp_path / "key"))
    for bad in ('a"b', "a b", "a\\b", "", "x'y"):
        with pytest.raises(SpecdeployError) as e:
            secret_files(hv, bad)
        assert "specdeploy_api_key_file" in str(e.value) and "Fix:" in str(e.value)


def test_plan_names_the_other_engines_files_for_a_switch():
    from specdeploy.plan import render_host
    plan = render_host("h", _hv(specdeploy_engine="sglang", specdeploy_engine_version="0.5.9")).to_dict()
    (other,) = plan["other_engines"]
    assert other["engine"] == "vllm" and other["unit"] == "specdeploy-vllm.service"
    vllm = render_host("h", _hv())
    assert set(other["files"]) == {p for p in vllm.files if "vllm" in p}  # exactly what a vLLM deploy installs


def test_preflight_names_an_api_key_the_engine_could_not_read(tmp_path):
    from specdeploy.checks.preflight import preflight_host
    (tmp_path / "key").write_text('my "key"\n')
    v = {"specdeploy_engine": "vllm", "specdeploy_engine_version": "0.16.0", "specdeploy_hardware": "h200_nvl8",
         "specdeploy_model_path": "/models/m", "specdeploy_spec_enabled": False,
         "specdeploy_api_key_file": str(tmp_path / "key")}
    bad = [f for f in preflight_host("h", v, None).findings if f.subject == "specdeploy_api_key_file"]
    assert [(f.severity, f.host) for f in bad] == [("error", "h")]
    (tmp_path / "key").write_text("sk-0123abcd\n")
    assert not [f for f in preflight_host("h", v, None).findings if f.subject == "specdeploy_api_key_file"]
