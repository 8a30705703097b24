"""The monitoring role's pins and the dashboard's DCGM fields, held to facts read from upstream (tests/data, with
their sources), and the repository-key check run on real keys made by gpg."""
import csv
import os
import re
import shutil
import subprocess
import time

import pytest
import yaml

from helpers import REPO
from specdeploy.speculation.monitoring import gpg_key_problem, panels, render_rules
from specdeploy.plan.render.prometheus import DCGM_EXPORTER_PORT, NODE_EXPORTER_PORT, render_prometheus

FACTS = yaml.safe_load((REPO / "tests/data/monitoring-facts.yml").read_text())
ROLE = REPO / "ansible/roles/monitoring"
DEFAULTS = yaml.safe_load((ROLE / "defaults/main/role.yml").read_text())


def _fact(part: str, name: str):
    return FACTS[part][name]["value"]


def _default_counters() -> dict[str, tuple[str, str]]:
    """DCGM field -> (Prometheus type, help), from dcgm-exporter's default-counters.csv."""
    lines = [ln for ln in (REPO / _fact("dcgm_exporter", "default_counters")).read_text().splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    return {row[0].strip(): (row[1].strip(), ",".join(row[2:]).strip()) for row in csv.reader(lines)}


def test_every_fact_names_its_source():
    for part, facts in FACTS.items():
        for name, fact in facts.items():
            assert set(fact) == {"value", "source"} and str(fact["source"]).strip(), (part, name)


def test_role_defaults_are_the_checked_facts():
    assert DEFAULTS["monitoring_grafana_apt_url"] == _fact("grafana", "apt_url")
    assert DEFAULTS["monitoring_grafana_key_url"] == _fact("grafana", "key_url")
    assert DEFAULTS["monitoring_grafana_key_fingerprint"] == _fact("grafana", "key_fingerprint")
    assert DEFAULTS["monitoring_dcgm_package"] == _fact("dcgm", "package")
    assert DEFAULTS["monitoring_dcgm_exporter_package"] == _fact("dcgm_exporter", "package")
    assert DEFAULTS["monitoring_dcgm_exporter_service"] == _fact("dcgm_exporter", "service")
    assert DEFAULTS["monitoring_nvidia_repo_url"] == _fact("nvidia_repo", "url")
    assert DEFAULTS["monitoring_nvidia_keyring_version"] == _fact("nvidia_repo", "keyring_version")
    assert DEFAULTS["monitoring_prometheus_url"].endswith(f":{_fact('prometheus', 'port')}")
    assert (NODE_EXPORTER_PORT, DCGM_EXPORTER_PORT) == (_fact("node_exporter", "port"), _fact("dcgm_exporter", "port"))
    tasks = "".join(p.read_text() for p in (ROLE / "tasks").glob("*.yml"))
    for part in ("node_exporter", "grafana"):
        assert re.search(rf"name: \"?{_fact(part, 'package')}\b", tasks), part
        assert f"name: {_fact(part, 'service')}\n" in tasks, part
    assert "name: prometheus\n" in tasks and "/usr/bin/promtool" in tasks


def test_every_role_default_has_its_argument_spec():
    spec = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert set(spec) == set(DEFAULTS)
    for name, value in DEFAULTS.items():
        assert spec[name]["default"] == value, name


def test_grafana_reads_the_admin_password_itself():
    """grafana-server expands $__file{} after applying environment overrides; GF_*__FILE is only the Docker image's
    entrypoint's, so on a package install it would leave the default password in place."""
    tasks = yaml.safe_load((ROLE / "tasks/grafana.yml").read_text())
    block = next(t for t in tasks if t.get("name") == "Grafana - install")["block"]
    from specdeploy.values.hostpaths import host_path
    conf = host_path("unit_dropin", "grafana-server.service", "specdeploy.conf")
    assert conf == "/etc/systemd/system/grafana-server.service.d/specdeploy.conf"
    dropin = next(t for t in block if "specdeploy_path('grafana-server.service', 'specdeploy.conf')"
                  in str(t.get("ansible.builtin.copy", {}).get("dest", "")))["ansible.builtin.copy"]["content"]
    env = dict(ln.removeprefix("Environment=").split("=", 1) for ln in dropin.splitlines()
               if ln.startswith("Environment="))
    assert not [k for k in env if k.endswith("__FILE")]
    assert env["GF_SECURITY_ADMIN_PASSWORD"] == "$__file{/etc/grafana/admin_password}"
    copied = next(t for t in block if t.get("ansible.builtin.copy", {}).get("dest") == "/etc/grafana/admin_password")
    assert copied["ansible.builtin.copy"]["group"] == "grafana" and copied.get("no_log") is True


def _dcgm_names(text: str) -> set[str]:
    return set(re.findall(r"\bDCGM_FI_[A-Z0-9_]+", text))


def test_dashboard_and_rules_use_only_default_dcgm_fields():
    counters = _default_counters()
    used = _dcgm_names(" ".join(expr for _, _, _, targets in panels() for _, expr in targets)) | _dcgm_names(
        render_rules())
    assert used, "the dashboard shows GPU panels from dcgm-exporter"
    assert used <= set(counters), used - set(counters)


def test_dcgm_panel_units_match_the_fields_units():
    counters = _default_counters()
    unit_of = {"%": "percent", "MiB": "mbytes", "W": "watt"}
    for _, title, unit, targets in panels():
        for _, expr in targets:
            for name in _dcgm_names(expr):
                m = re.search(r"\(in (\w+|%)\)", counters[name][1])
                assert m and unit == unit_of[m.group(1)], (title, name, unit, counters[name][1])


def test_dcgm_sample_is_what_the_exporter_would_publish():
    counters = _default_counters()
    text = (REPO / "tests/data/dcgm-sample.prom").read_text()
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.MULTILINE))
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    assert helps and set(helps) <= set(counters)
    for name, help_text in helps.items():
        assert (types[name], help_text) == counters[name], name


def test_scrape_config_targets_the_exporters_ports():
    t = {"host": "g1", "address": "10.0.0.5", "engine": "vllm", "engine_port": 8000, "exporter_port": 9450}
    jobs = {j["job_name"]: j for j in yaml.safe_load(render_prometheus([t]))["scrape_configs"]}
    assert jobs["node"]["static_configs"][0]["targets"] == [f"10.0.0.5:{_fact('node_exporter', 'port')}"]
    assert jobs["dcgm"]["static_configs"][0]["targets"] == [f"10.0.0.5:{_fact('dcgm_exporter', 'port')}"]
    jobs = {j["job_name"]: j for j in yaml.safe_load(
        render_prometheus([dict(t, node_port=19100, dcgm_port=19400)]))["scrape_configs"]}
    assert jobs["node"]["static_configs"][0]["targets"] == ["10.0.0.5:19100"]
    assert jobs["dcgm"]["static_configs"][0]["targets"] == ["10.0.0.5:19400"]


# --- the repository-key check, on keys gpg makes here -------------------------------------------------------------

@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """An armored file with three keys: usable, expired (made in 2020, valid one day) and revoked."""
    assert shutil.which("gpg"), "gpg is missing: bash scripts/setup.sh installs it (Debian package gpg)"
    home = tmp_path_factory.mktemp("gnupg")
    os.chmod(home, 0o700)
    env = dict(os.environ, GNUPGHOME=str(home))

    def gpg(*args, **kw):
        return subprocess.run(["gpg", "--batch", "--passphrase", "", *args], env=env, check=True,
                              capture_output=True, **kw)
    gpg("--quick-gen-key", "Repo <repo@example.invalid>", "ed25519", "sign", "0")
    gpg("--faked-system-time", "20200101T000000", "--quick-gen-key", "Old <old@example.invalid>", "ed25519", "sign",
        "1d")
    gpg("--quick-gen-key", "Gone <gone@example.invalid>", "ed25519", "sign", "0")
    fprs = {}
    for line in gpg("--list-keys", "--with-colons", text=True).stdout.splitlines():
        f = line.split(":")
        if f[0] == "fpr":
            last = f[9]
        elif f[0] == "uid":
            fprs[f[9].split()[0].lower()] = last
    rev = (home / "openpgp-revocs.d" / f"{fprs['gone']}.rev").read_text().replace(":-----BEGIN", "-----BEGIN")
    gpg("--import", input=rev.encode())
    bundle = home / "bundle.asc"
    bundle.write_bytes(gpg("--armor", "--export").stdout)
    shown = subprocess.run(["gpg", "--show-keys", "--with-colons", str(bundle)], env=env, check=True,
                           capture_output=True, text=True).stdout
    yield fprs, shown
    subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env, check=False)  # no agent left behind


def test_pinned_usable_key_passes(keys):
    fprs, shown = keys
    assert gpg_key_problem(shown, fprs["repo"]) == ""
    assert gpg_key_problem(shown, " ".join(re.findall("....", fprs["repo"].lower()))) == ""  # as people write it


def test_expired_revoked_and_missing_keys_are_named(keys):
    fprs, shown = keys
    assert gpg_key_problem(shown, fprs["old"]) == f"key {fprs['old']} expired on 2020-01-02"
    assert gpg_key_problem(shown, fprs["gone"]) == f"key {fprs['gone']} is revoked"
    other = "B53AE77BADB630A683046005963FA27710458545"
    got = gpg_key_problem(shown, other)
    assert got.startswith(f"no key with fingerprint {other}") and fprs["repo"] in got
    assert gpg_key_problem("", other) == "the file holds no OpenPGP public key"
    # a key valid today that expires later, judged at a time after its expiry
    lines = shown.splitlines()
    line = lines[lines.index(f"fpr:::::::::{fprs['repo']}:") - 1]
    assert line.startswith("pub:")
    later = shown.replace(line, ":".join(line.split(":")[:6] + [str(int(time.time()) + 60)] + line.split(":")[7:]))
    assert gpg_key_problem(later, fprs["repo"], now=time.time() + 3600).startswith(f"key {fprs['repo']} expired")


def test_the_role_uses_the_key_check():
    tasks = (ROLE / "tasks/grafana.yml").read_text()
    assert tasks.count("specdeploy_gpg_key_check(monitoring_grafana_key_fingerprint)") == 2
    assert "fpr:::::::::" not in tasks
