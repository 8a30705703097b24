"""Read Ansible inventories through Ansible's own API, so ``ansible-playbook`` and specdeploy see the same
variables (group_vars/, host_vars/, -e overrides)."""
from __future__ import annotations

import os
import shlex
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specdeploy.values.errors import Finding, SpecdeployError
from specdeploy.hostvars.inventory_ansible import Vault, plain
from specdeploy.hostvars.inventory_files import check_text, read_bytes
from specdeploy.hostvars.schema import HostVars, validate_host

ENGINE_GROUP = "specdeploy_engines"
MONITORING_GROUP = "specdeploy_monitoring"


@dataclass
class Host:
    name: str
    vars: dict[str, Any]
    hv: HostVars

    @property
    def address(self) -> str:
        return str(self.vars.get("ansible_host", self.name))


@dataclass
class Inventory:
    path: Path
    engine_hosts: list[Host]
    monitoring_hosts: list[str]
    all_vars: dict[str, dict[str, Any]]
    # Every engine host of the serving groups (specdeploy_group) the engine hosts belong to, --limit or not, in
    # inventory order: topology.ranks resolves each host's rank from it.
    group_hosts: list[Host] = field(default_factory=list)
    # what inventory_checks found worth saying but not refusing (commands print them)
    warnings: list[Finding] = field(default_factory=list)
    # every value that came out of a vault (the deploy's event log scrubs them)
    secrets: set[str] = field(default_factory=set)

    def host(self, name: str) -> Host:
        for h in self.engine_hosts:
            if h.name == name:
                return h
        raise SpecdeployError([Finding("error", "--host", f"'{name}' is not in group {ENGINE_GROUP} of {self.path}",
                                       f"use one of: {', '.join(h.name for h in self.engine_hosts)}")])


def _mapping(text: str, where: str) -> dict[str, Any]:
    from specdeploy.values.bounded import yaml_depth
    deep = yaml_depth(text)
    if deep:
        raise SpecdeployError([Finding("error", "-e", f"{where} {deep}", "give a flatter mapping")])
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise SpecdeployError([Finding("error", "-e", f"{where} is not valid YAML/JSON{at}",
                                       "give a mapping such as '{\"key\": \"value\"}' or KEY=VALUE")]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecdeployError([Finding("error", "-e", f"{where} is not a mapping",
                                       "give KEY: VALUE lines, a JSON object, or KEY=VALUE")])
    return data


def parse_extra_vars(items: list[str] | None, vault: Vault | None = None,
                     vaulted: set[str] | None = None, vaulted_files: list[Path] | None = None) -> dict[str, Any]:
    """``-e`` as ansible-playbook takes it: ``@file`` (YAML or JSON; vault-encrypted or with ``!vault`` values,
    decrypted with ``vault``'s secrets), an inline JSON/YAML mapping (``'{"k": {...}}'``), or space-separated
    ``KEY=VALUE`` pairs (values YAML-typed). Later items win. ``vaulted`` collects the keys whose value came out of
    a vault, ``vaulted_files`` the (absolute) ``@file``s that hold vaulted text."""
    out: dict[str, Any] = {}
    for item in items or []:
        item = item.strip()
        if item.startswith("@"):
            p = Path(item[1:])
            if p.is_dir():
                raise SpecdeployError([Finding("error", "-e", f"{p} is a directory where a file is expected",
                                               "give a YAML or JSON file of variables")])
            if not p.exists():
                raise SpecdeployError([Finding("error", "-e", f"{p} does not exist", "give an existing YAML file")])
            try:
                raw = read_bytes(p)
                text = raw.decode("utf-8")
            except SpecdeployError as exc:
                raise SpecdeployError([Finding("error", "-e", f"{f.subject} {f.message}", f.fix)
                                       for f in exc.problems]) from None
            except UnicodeDecodeError:
                raise SpecdeployError([Finding("error", "-e", f"{p} is not UTF-8 text",
                                               "give a YAML or JSON file of variables")]) from None
            if text.lstrip().startswith("$ANSIBLE_VAULT") or "!vault" in text:
                from specdeploy.hostvars.inventory_ansible import vaulted_vars_file
                data, keys = vaulted_vars_file(p, vault)
                if vaulted_files is not None:
                    vaulted_files.append(p.resolve())
                if vaulted is not None:
                    vaulted.update(keys)
                out.update(data)
                continue
            check_text(p, text)
            out.update(_mapping(text, str(p)))
            continue
        if item.startswith(("{", "[")):
            out.update(_mapping(item, f"'{item[:60]}'"))
            continue
        try:
            pairs = shlex.split(item)
        except ValueError as exc:
            raise SpecdeployError([Finding("error", "-e", f"'{item}': {exc}", "balance the quotes")]) from None
        for pair in pairs:
            if "=" not in pair:
                raise SpecdeployError([Finding("error", "-e", f"'{pair}' is not KEY=VALUE",
                                               "write -e KEY=VALUE, -e '{\"KEY\": VALUE}' or -e @file.yml")])
            key, _, raw = pair.partition("=")
            from specdeploy.values.bounded import yaml_depth
            deep = yaml_depth(raw)
            if deep:
                raise SpecdeployError([Finding("error", "-e", f"the value of {key.strip()[:60]} {deep}",
                                               "give a flatter value")])
            try:
                out[key.strip()] = yaml.safe_load(raw) if raw != "" else ""
            except (yaml.YAMLError, RecursionError):
                out[key.strip()] = raw
    return out


def _ansible_load(path: Path, extra: dict[str, Any], vault: Vault | None = None):
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.vars.manager import VariableManager

    from specdeploy.hostvars.inventory_ansible import guarded_loader
    loader, secrets = guarded_loader(path, vault)
    try:
        inv = InventoryManager(loader=loader, sources=[str(path)])
    except AnsibleError as exc:
        loader.check()
        raise _ansible_error(exc, path) from None
    loader.check()
    vm = VariableManager(loader=loader, inventory=inv)
    vm._extra_vars = _trusted(dict(extra))  # what ansible-playbook -e does: its values are templates it renders
    return inv, vm, secrets


def _trusted(value):
    """``-e`` values as ansible-playbook holds them: strings trusted as templates (Ansible 2.19 renders only
    trusted strings; ansible-playbook trusts its command line), so that a plan shows what the play renders."""
    try:
        from ansible.template import trust_as_template
    except ImportError:  # an Ansible that trusts every string
        return value
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {k: _trusted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_trusted(v) for v in value]
    return value


def _ansible_error(exc: Exception, path: Path) -> SpecdeployError:
    """Ansible's parse errors carry the file deep in their cause chain; name that file, not a traceback."""
    where, c = str(path), exc
    while c is not None:
        obj = getattr(c, "obj", None)
        if obj is not None and str(obj).strip():
            where = str(obj)
            break
        c = c.__cause__ or c.__context__
    msg = (str(getattr(exc, "message", "") or exc).strip().splitlines() or ["cannot be parsed"])[0]
    return SpecdeployError([Finding("error", where, msg,
                                    "fix the YAML in that file (indentation, quoting of values with ': ')")])


def _ansible_vars(vm, host, path: Path) -> dict[str, Any]:
    from ansible.errors import AnsibleError
    try:
        return vm.get_vars(host=host, include_hostvars=False)
    except AnsibleError as exc:
        vm._loader.check()
        raise _ansible_error(exc, path) from None


def _check_path(path: Path):
    """The -i path exists and is a directory or a regular file; group_vars/ and host_vars/ beside it are
    directories (Ansible skips them silently otherwise)."""
    if not path.exists():
        raise SpecdeployError([Finding("error", "-i", f"inventory {path} does not exist",
                                       "give an inventory directory such as inventory/example")])
    if not path.is_dir():
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise SpecdeployError([Finding("error", str(path), "is not a regular file or a directory (a FIFO, socket "
                                           "or device); specdeploy does not read from it",
                                           "give an inventory directory or a YAML file")])
    base = path if path.is_dir() else path.parent
    for d in ("group_vars", "host_vars"):
        p = base / d
        if (p.exists() or p.is_symlink()) and not p.is_dir():
            raise SpecdeployError([Finding("error", str(p), "is not a directory; Ansible would ignore it and its "
                                           "variables with it", f"make {d} a directory of <name>.yml files")])


def host_variables(path: Path, extra: dict[str, Any] | None = None, vault: Vault | None = None):
    """(inventory, {host: variables}) with every specdeploy_* value templated as Ansible would.
    A host whose variables cannot be templated maps to the SpecdeployError instead.
    Static YAML inventories are read natively (inventory_native, the same answer without importing Ansible);
    whatever that reader does not reproduce exactly (vaulted values among it) is read through Ansible's own API.
    Every file either reader opens is held to inventory_files' rules first."""
    from specdeploy.hostvars.inventory_checks import prescan
    from specdeploy.hostvars.inventory_native import Unsupported, read
    bad = prescan(path)
    if bad:  # a name no reader should see (Ansible drops what it cannot parse, unnamed)
        raise SpecdeployError(bad)
    try:
        inv, out = read(path, extra or {})
    except Unsupported:
        inv, out = ansible_host_variables(path, extra, vault)
    check(inv, path, out, extra or {})
    return inv, out


def check(inv, path: Path, variables: dict[str, Any], extra: dict[str, Any]) -> None:
    """inventory_checks on what either reader read: raise its errors (all of them), keep its warnings on ``inv``
    (``specdeploy_warnings``)."""
    from specdeploy.hostvars.inventory_checks import check_conflicts, check_names
    groups = [g for g in getattr(inv, "groups", {}) if g not in ("all", "ungrouped")]
    errors = check_names({h: v if isinstance(v, dict) else {} for h, v in variables.items()}, groups, str(path))
    if errors:  # a bad name is refused before anything builds a path or a pattern from it
        raise SpecdeployError(errors)
    base = path if path.is_dir() else path.parent
    errors, warnings = check_conflicts(inv, base, variables, extra, ENGINE_GROUP)
    if errors:
        raise SpecdeployError(errors)
    inv.specdeploy_warnings = warnings


def ansible_host_variables(path: Path, extra: dict[str, Any] | None = None, vault: Vault | None = None):
    """host_variables through Ansible's InventoryManager, VariableManager and Templar, with the vault secrets
    ansible-playbook would use (vault: the ones given on the command line)."""
    from ansible.template import Templar

    from specdeploy.hostvars.inventory_ansible import undecryptable, vault_context
    from specdeploy.hostvars.inventory_ansible import encrypted_values
    from specdeploy.hostvars.inventory_native import templated
    from specdeploy.hostvars.jinja_guard import BUDGET_S, TimeUp, time_limit
    inv, vm, secrets = _ansible_load(path, extra or {}, vault)
    out: dict[str, Any] = {}
    opened: set[str] = set()
    at = ("", "")
    spent = 0.0  # the budget bounds rendering the templates, over all hosts; Ansible's own reading is linear
    try:
        with vault_context(secrets):
            for h in inv.get_hosts():
                at = (h.name, "")
                raw = _ansible_vars(vm, h, path)
                locked = undecryptable(raw, h.name)
                if locked:
                    out[h.name] = SpecdeployError(locked)
                    continue
                opened.update(str(e) for v in raw.values() for e in encrypted_values(v))
                templar = Templar(loader=vm._loader, variables=raw)
                t0 = time.monotonic()
                try:
                    done = {}
                    with time_limit(max(0.01, BUDGET_S - spent)):
                        for k, v in raw.items():
                            at = (h.name, k)
                            done[k] = _template(templar, k, v, h.name) if templated(k) else v
                    out[h.name] = plain(done)
                except SpecdeployError as exc:
                    out[h.name] = exc
                finally:
                    spent += time.monotonic() - t0
    except TimeUp:
        raise SpecdeployError([Finding("error", at[1] or "inventory", f"rendering the inventory's templates took "
                                       f"more than {BUDGET_S:g} s (at {at[1] or 'the variables'} of {at[0]})",
                                       "simplify the template: a plan or a preflight renders every host's "
                                       "variables", at[0] or None)]) from None
    inv.specdeploy_secrets = opened
    return inv, out



def engine_host_names(inv, path: Path, limit: str | None) -> list[str]:
    names = [h.name for h in inv.get_hosts(ENGINE_GROUP)]
    if not names:
        raise SpecdeployError([Finding("error", ENGINE_GROUP, f"inventory {path} has no group {ENGINE_GROUP}",
                                       f"put the engine hosts under a group named {ENGINE_GROUP}")])
    if limit:
        wanted = {h.name for h in inv.get_hosts(limit)}
        if not wanted:
            raise SpecdeployError([Finding("error", "--limit", f"'{limit}' matches no host in {path}",
                                           "give a host or group name from the inventory")])
        names = [n for n in names if n in wanted]
    return names


def load(path: str | os.PathLike, limit: str | None = None, extra: dict[str, Any] | None = None,
         vault: Vault | None = None) -> Inventory:
    path = Path(path)
    _check_path(path)
    inv, all_vars = host_variables(path, extra, vault)
    if not all_vars:
        raise SpecdeployError([Finding("error", "-i", f"inventory {path} has no hosts",
                                       "add hosts to hosts.yml (see inventory/example)")])
    problems: list[Finding] = []
    hosts: list[Host] = []
    wanted = engine_host_names(inv, path, limit)
    for name in wanted:
        variables = all_vars[name]
        if isinstance(variables, SpecdeployError):
            problems.extend(variables.problems)
            continue
        try:
            hosts.append(Host(name, variables, validate_host(name, variables)))
        except SpecdeployError as exc:
            problems.extend(exc.problems)
    if problems:
        raise SpecdeployError(problems)
    members = _group_members(inv, path, all_vars, hosts)
    monitoring = [h.name for h in inv.get_hosts(MONITORING_GROUP)]
    return Inventory(path, hosts, monitoring, {k: v for k, v in all_vars.items() if isinstance(v, dict)}, members,
                     list(getattr(inv, "specdeploy_warnings", [])), set(getattr(inv, "specdeploy_secrets", ())))


def _group_members(inv, path: Path, all_vars, hosts: list[Host]) -> list[Host]:
    """The engine hosts of every serving group a host of ``hosts`` belongs to, in inventory order: a command
    limited to one rank still renders it from its whole group."""
    named = {h.hv.specdeploy_group for h in hosts if h.hv.specdeploy_group}
    have = {h.name: h for h in hosts}
    out: list[Host] = []
    problems: list[Finding] = []
    for name in engine_host_names(inv, path, None):
        if name in have:
            out.append(have[name])
            continue
        variables = all_vars[name]
        if not named or not isinstance(variables, dict) or variables.get("specdeploy_group") not in named:
            continue
        try:
            out.append(Host(name, variables, validate_host(name, variables)))
        except SpecdeployError as exc:
            problems.extend(exc.problems)
    if problems:
        raise SpecdeployError(problems)
    return out


def _template(templar, key, value, host):
    from specdeploy.hostvars.jinja_guard import problems_in
    refused = problems_in(value, key)
    if refused:
        where, why = refused[0]
        raise SpecdeployError([Finding("error", where, f"is a template that {why}; specdeploy renders an "
                                       "inventory's templates within bounds and refuses this one",
                                       "give the value itself, or a template of variable references and "
                                       "filters", host)])
    from specdeploy.hostvars.jinja_guard import CLOCK, TimeUp
    try:
        return templar.template(value)
    except Exception as exc:  # Ansible raises many types; all mean the same to the user
        if CLOCK.expired:
            raise TimeUp() from None
        raise SpecdeployError([Finding("error", key, f"cannot be templated: {exc}".splitlines()[0],
                                       "fix the Jinja expression or define the variables it uses", host)]) from None


