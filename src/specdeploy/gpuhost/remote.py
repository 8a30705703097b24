"""Reading engine hosts over SSH (``specdeploy preflight --hosts``)."""
from __future__ import annotations

import subprocess

from specdeploy.gpuhost.report import HostFacts, check_host, facts_from_sections, gather_script, split_sections
from specdeploy.hostvars.ssh import ssh_argv
from specdeploy.values.errors import Report


def probe(host: str, variables: dict, timeout: float = 120,
          reach: tuple[str, int] | None = None) -> tuple[HostFacts | None, str | None]:
    """Run the read-only gather script on the host (as root through ``sudo -n`` when not root); ``reach``: the
    group leader's rendezvous (address, port) this host tries to connect to."""
    script = gather_script(reach)
    user = variables.get("ansible_user")
    remote = "sh -s" if user in (None, "root") else "if sudo -n true 2>/dev/null; then sudo -n sh -s; else sh -s; fi"
    try:
        r = subprocess.run(ssh_argv(host, variables) + [remote], input=script, capture_output=True, text=True,
                           timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"ssh failed: {exc}"
    if r.returncode == 255 or "@@begin" not in r.stdout:
        return None, (r.stderr.strip().splitlines() or [f"ssh exited {r.returncode}"])[-1]
    return facts_from_sections(split_sections(r.stdout)), None


def preflight_hosts(inventory: str, limit: str | None = None, extra: dict | None = None,
                    probe_fn=probe, vault=None) -> dict[str, Report]:
    """``specdeploy preflight --hosts``: read every engine host over SSH (read-only) and report each gap."""
    from pathlib import Path

    from specdeploy.hostvars.inventory import _check_path, engine_host_names, host_variables
    from specdeploy.hostvars.schema import validate_host
    from specdeploy.values.errors import Finding, SpecdeployError
    path = Path(inventory)
    _check_path(path)
    from concurrent.futures import ThreadPoolExecutor
    inv, all_vars = host_variables(path, extra, vault)
    names = engine_host_names(inv, path, limit)
    ranks, group_findings = _ranks(inv, path, all_vars, names)

    def one(name: str) -> Report:
        rep = Report()
        variables = all_vars[name]
        if isinstance(variables, SpecdeployError):
            rep.extend(variables.problems)
            return rep
        try:
            hv = validate_host(name, variables)
        except SpecdeployError as exc:
            rep.extend(exc.problems)
            return rep
        rank = ranks.get(name)
        joins = rank is not None and rank.multi_host and not rank.leader
        facts, err = (probe_fn(name, variables, reach=(rank.leader_address, rank.port)) if joins
                      else probe_fn(name, variables))
        if facts is None:
            rep.findings.append(Finding("error", "ssh", f"cannot read the host: {err}",
                                        "check ansible_host/ansible_user/ansible_ssh_private_key_file and that "
                                        "the host is up", name))
            return rep
        acs_off = str(variables.get("gpu_host_acs_disable", False)).lower() in ("true", "1", "yes")
        rep.extend(check_host(name, hv, facts, acs_off, ranks.get(name)).findings)
        return rep

    with ThreadPoolExecutor(max_workers=min(16, max(1, len(names)))) as pool:
        reports = dict(zip(names, pool.map(one, names)))
    for f in group_findings:  # a group its layout cannot serve: on the host the finding names, or the first
        reports.get(f.host if f.host in reports else names[0], Report()).findings.append(f)
    return reports


def _ranks(inv, path, all_vars, names):
    """(host -> rank, the group-level findings) over the serving groups of ``names``, their group-mates included;
    a host that does not validate is left to its own report."""
    from specdeploy.hostvars.inventory import engine_host_names
    from specdeploy.hostvars.schema import validate_host
    from specdeploy.topology import Member, check_members
    from specdeploy.values.errors import SpecdeployError
    members = []
    for name in engine_host_names(inv, path, None):
        variables = all_vars[name]
        if isinstance(variables, SpecdeployError):
            continue
        try:
            members.append(Member(name, str(variables.get("ansible_host", name)), validate_host(name, variables)))
        except SpecdeployError:
            continue
    try:
        return check_members(members, names)
    except SpecdeployError as exc:  # not reached: check_members resolves only the groups that passed
        return {}, exc.problems
