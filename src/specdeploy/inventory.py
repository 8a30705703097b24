"""Read Ansible inventories through Ansible's own API, so ``ansible-playbook`` and specdeploy see the same
variables (group_vars/, host_vars/, -e overrides)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import Finding, SpecdeployError
from .schema import HostVars, validate_host

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

    def host(self, name: str) -> Host:
        for h in self.engine_hosts:
            if h.name == name:
                return h
        raise SpecdeployError([Finding("error", "--host", f"'{name}' is not in group {ENGINE_GROUP} of {self.path}",
                                       f"use one of: {', '.join(h.name for h in self.engine_hosts)}")])


def parse_extra_vars(items: list[str] | None) -> dict[str, Any]:
    """``-e KEY=VALUE`` (YAML-typed value) or ``-e @file.yml``, like ansible-playbook."""
    out: dict[str, Any] = {}
    for item in items or []:
        if item.startswith("@"):
            p = Path(item[1:])
            if not p.is_file():
                raise SpecdeployError([Finding("error", "-e", f"{p} does not exist", "give an existing YAML file")])
            data = yaml.safe_load(p.read_text()) or {}
            if not isinstance(data, dict):
                raise SpecdeployError([Finding("error", "-e", f"{p} is not a YAML mapping", "write KEY: VALUE lines")])
            out.update(data)
            continue
        if "=" not in item:
            raise SpecdeployError([Finding("error", "-e", f"'{item}' is not KEY=VALUE", "write -e KEY=VALUE")])
        key, _, raw = item.partition("=")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


def _ansible_load(path: Path, extra: dict[str, Any]):
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    inv = InventoryManager(loader=loader, sources=[str(path)])
    vm = VariableManager(loader=loader, inventory=inv)
    vm._extra_vars = dict(extra)  # what ansible-playbook -e does
    return inv, vm


def load(path: str | os.PathLike, limit: str | None = None, extra: dict[str, Any] | None = None) -> Inventory:
    path = Path(path)
    if not path.exists():
        raise SpecdeployError([Finding("error", "-i", f"inventory {path} does not exist",
                                       "give an inventory directory such as inventory/example")])
    inv, vm = _ansible_load(path, extra or {})
    all_hosts = inv.get_hosts()
    if not all_hosts:
        raise SpecdeployError([Finding("error", "-i", f"inventory {path} has no hosts",
                                       "add hosts to hosts.yml (see inventory/example)")])
    engine_names = [h.name for h in inv.get_hosts(ENGINE_GROUP)]
    if not engine_names:
        raise SpecdeployError([Finding("error", ENGINE_GROUP, f"inventory {path} has no group {ENGINE_GROUP}",
                                       f"put the engine hosts under a group named {ENGINE_GROUP}")])
    if limit:
        wanted = {h.name for h in inv.get_hosts(limit)}
        if not wanted:
            raise SpecdeployError([Finding("error", "--limit", f"'{limit}' matches no host in {path}",
                                           "give a host or group name from the inventory")])
        engine_names = [n for n in engine_names if n in wanted]
    problems: list[Finding] = []
    hosts: list[Host] = []
    all_vars: dict[str, dict[str, Any]] = {}
    from ansible.template import Templar
    for h in all_hosts:
        raw = vm.get_vars(host=h, include_hostvars=False)
        templar = Templar(loader=vm._loader, variables=raw)
        all_vars[h.name] = {k: (_template(templar, k, v, h.name) if k.startswith("specdeploy_") else v)
                            for k, v in raw.items()}
    for name in engine_names:
        variables = _plain(all_vars[name])
        try:
            hosts.append(Host(name, variables, validate_host(name, variables)))
        except SpecdeployError as exc:
            problems.extend(exc.problems)
    if problems:
        raise SpecdeployError(problems)
    monitoring = [h.name for h in inv.get_hosts(MONITORING_GROUP)]
    return Inventory(path, hosts, monitoring, {k: _plain(v) for k, v in all_vars.items()})


def _template(templar, key, value, host):
    try:
        return templar.template(value)
    except Exception as exc:  # Ansible raises many types; all mean the same to the user
        raise SpecdeployError([Finding("error", key, f"cannot be templated: {exc}".splitlines()[0],
                                       "fix the Jinja expression or define the variables it uses", host)]) from None


def _plain(obj):
    """Ansible's vars carry its own str/dict subclasses (and lazy templates); make them plain."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, float)):
        return obj
    return str(obj)
