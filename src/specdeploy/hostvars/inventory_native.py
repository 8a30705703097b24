"""A reader of static YAML inventories that gives the variables ``ansible-playbook`` gives, without importing Ansible.

It covers what specdeploy's inventories use: YAML inventory files (one file, or a directory of ``*.yml``/``*.yaml``),
``group_vars/`` and ``host_vars/`` beside them (``<name>``, ``<name>.yml|.yaml|.json`` or a directory of such files),
Ansible's default variable precedence, ``-e`` extra vars, plain ``{{ name }}`` references, and ``--limit`` patterns
of plain names joined by ``,`` or ``:`` with ``!`` and ``&``. Anything else raises :class:`Unsupported` before any
value is returned, and the caller reads the inventory through Ansible instead: INI, scripts, inventory plugins, vault,
host ranges and ports in host names, Jinja beyond a variable reference, Ansible settings that change how variables
are read (ansible.cfg keys or ``ANSIBLE_*`` environment variables outside a known-harmless list), vars plugins, and
``group_vars/``/``host_vars/`` beside the working directory (playbook-adjacent vars)."""
from __future__ import annotations

import configparser
import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from specdeploy.hostvars.inventory_files import checked_text, group_loop, loop_in

YAML_EXTS = (".yml", ".yaml")
VARS_EXTS = ("", ".yml", ".yaml", ".json")
# directory entries Ansible skips when it reads an inventory directory (its defaults)
IGNORED_NAMES = ("host_vars", "group_vars", "vars_plugins")
IGNORED_EXTS = (".pyc", ".pyo", ".swp", ".bak", "~", ".rpm", ".md", ".txt", ".rst", ".orig", ".cfg", ".retry")
LOCALHOST = ("127.0.0.1", "localhost", "::1")
LEGACY_VARS_PLUGIN_DIRS = ("~/.ansible/plugins/vars", "/usr/share/ansible/plugins/vars")
# Ansible settings that do not change which variables a host gets come from the installed release's own definitions
# and plugin options (hostvars.ansible_settings); besides them only the variable naming ansible.cfg (which is then
# read key by key) and [defaults] keys that earlier releases read and this one ignores
HARMLESS_ENV = {"ANSIBLE_CONFIG"}
HARMLESS_CFG = {"collections_paths", "become", "become_user", "become_method", "result_format"}
# sections that only configure connections, output and galaxy: any key in them is harmless
HARMLESS_SECTIONS = {"ssh_connection", "connection", "paramiko_connection", "persistent_connection",
                     "privilege_escalation", "colors", "diff", "galaxy", "selinux"}
NAME = re.compile(r"[A-Za-z0-9_.-]+\Z")
GROUP = re.compile(r"[A-Za-z0-9_-]+\Z")
TEMPLATE_MARKS = ("{{", "{%", "{#")
REF = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
IPV4 = re.compile(r"\d+\.\d+\.\d+\.\d+\Z")


class Unsupported(Exception):
    """The inventory uses something this reader does not reproduce exactly; read it through Ansible."""


class Group:
    def __init__(self, name: str):
        self.name, self.vars, self.priority = name, {}, 1
        self.children: list[Group] = []
        self.parents: list[Group] = []
        self.hosts: list[str] = []
        self._ordered: list[str] | None = None
        self._frozen = False
        self._ancestors: set[str] | None = None

    def ancestors(self) -> set[str]:
        if self._ancestors is not None:
            return self._ancestors
        got = _reach(self, "parents")
        if self._frozen:
            self._ancestors = got
        return got

    def descendants(self) -> set[str]:
        return _reach(self, "children")

    def ordered_hosts(self) -> list[str]:
        """Ansible's order: this group's hosts, then its children's, breadth first. Memoised once the inventory is
        reconciled (NativeInventory.freeze): a host's variables list every group's hosts, and recomputing them per
        host made reading an inventory quadratic in its hosts."""
        if self._ordered is not None:
            return self._ordered
        order, seen, level = [self], {self.name}, [self]
        while level:
            nxt = []
            for g in level:
                for c in g.children:
                    if c.name not in seen:
                        seen.add(c.name)
                        order.append(c)
                        nxt.append(c)
            level = nxt
        out: list[str] = []
        have: set[str] = set()
        for g in order:
            for h in g.hosts:
                if h not in have:
                    have.add(h)
                    out.append(h)
        if self._frozen:
            self._ordered = out
        return out


class HostRef:
    def __init__(self, name: str):
        self.name = name


def _fail(why: str):
    raise Unsupported(why)


def _check_settings(cwd: Path) -> None:
    from specdeploy.hostvars.ansible_settings import harmless
    ok_env, ok_ini = harmless()
    odd = sorted(k for k in os.environ if k.startswith("ANSIBLE_") and k not in HARMLESS_ENV and k not in ok_env)
    if odd:
        _fail(f"Ansible settings in the environment: {', '.join(odd)}")
    for d in LEGACY_VARS_PLUGIN_DIRS:
        p = Path(os.path.expanduser(d))
        if p.is_dir() and any(p.iterdir()):
            _fail(f"vars plugins in {p}")
    cfgs = [os.environ.get("ANSIBLE_CONFIG", ""), str(cwd / "ansible.cfg"), os.path.expanduser("~/.ansible.cfg"),
            "/etc/ansible/ansible.cfg"]
    cfg = next((c for c in cfgs if c and os.path.isfile(c)), None)
    if cfg:
        cp = configparser.ConfigParser(interpolation=None)
        try:
            cp.read(cfg, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError):
            _fail(f"{cfg} cannot be read here")
        for section in cp.sections():
            if section in HARMLESS_SECTIONS:
                continue
            odd = sorted(k for k in cp[section] if (section, k) not in ok_ini
                         and not (section == "defaults" and k in HARMLESS_CFG))
            if odd:
                _fail(f"{cfg} [{section}] {', '.join(odd[:3])}: settings that may change variables")
    for d in ("group_vars", "host_vars"):
        if (cwd / d).exists():
            _fail(f"{cwd / d} (playbook-adjacent vars)")


def _load_file(path: Path) -> Any:
    """As Ansible loads a file: JSON if it parses as JSON, else YAML; a file inventory_files refuses is refused."""
    text = checked_text(path)
    if text.lstrip().startswith("$ANSIBLE_VAULT"):
        _fail(f"{path} is vault-encrypted")
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError:
        _fail(f"{path} is not YAML this reader takes (Ansible reports the problem)")


def _plain_data(obj: Any, where: Path) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str) or k.startswith("__ansible"):
                _fail(f"{where}: key {k!r}")
            _plain_data(v, where)
    elif isinstance(obj, list):
        for v in obj:
            _plain_data(v, where)
    elif not (obj is None or isinstance(obj, (str, int, float, bool))):
        _fail(f"{where}: a value of type {type(obj).__name__}")


class NativeInventory:
    def __init__(self, source: Path):
        self.source = source
        self.groups: dict[str, Group] = {}
        self.hosts: dict[str, dict[str, Any]] = {}  # host -> vars set in inventory files (incl. inventory_file/dir)
        self._ansible = None
        self.group("all")
        self.group("ungrouped")
        self._child("all", "ungrouped")

    # -- parsing ---------------------------------------------------------------------------------------------
    def group(self, name: str) -> Group:
        if name not in self.groups:
            self.groups[name] = Group(name)
        return self.groups[name]

    def _child(self, parent: str, child: str, path: Path | None = None) -> None:
        p, c = self.groups[parent], self.groups[child]
        if c is p or p.name in c.descendants():
            tree = {n: [k.name for k in g.children] for n, g in self.groups.items()}
            tree[parent].append(child)
            raise group_loop(str(path or self.source), loop_in(tree) or [child, child])
        if c not in p.children:
            p.children.append(c)
            c.parents.append(p)

    def parse_file(self, path: Path) -> None:
        data = _load_file(path)
        if not isinstance(data, dict) or not data or "plugin" in data:
            _fail(f"{path} is not a YAML inventory this reader takes")
        _plain_data(data, path)
        for name, body in data.items():
            self._parse_group(name, body, path)

    def _parse_group(self, name: str, body: Any, path: Path) -> None:
        if not GROUP.match(name):
            _fail(f"{path}: group name {name!r}")
        if body is not None and not isinstance(body, dict):
            _fail(f"{path}: group {name} is not a mapping")
        g = self.group(name)
        for key, val in (body or {}).items():
            if key not in ("vars", "children", "hosts") or not isinstance(val, (dict, type(None))):
                _fail(f"{path}: group {name} has {key!r} that Ansible treats specially")
            if val is None:
                continue
            if key == "vars":
                for k, v in val.items():
                    if k == "ansible_group_priority":
                        if type(v) is not int:
                            _fail(f"{path}: ansible_group_priority of {name} is not an integer")
                        g.priority = v
                    g.vars[k] = v
            elif key == "children":
                for sub, sub_body in val.items():
                    if sub == "all":
                        _fail(f"{path}: group all under {name}")
                    self._parse_group(sub, sub_body, path)
                    self._child(name, sub, path)
            else:
                for host, hvars in val.items():
                    if not NAME.match(host) or host in LOCALHOST:
                        _fail(f"{path}: host {host!r} (ranges, ports and localhost are Ansible's to read)")
                    if hvars is not None and not isinstance(hvars, dict):
                        _fail(f"{path}: host {host} vars are not a mapping")
                    if host not in self.hosts:
                        src = os.path.normpath(os.path.abspath(path))
                        self.hosts[host] = {"inventory_file": src, "inventory_dir": os.path.dirname(src)}
                    if host not in g.hosts:
                        g.hosts.append(host)
                    self.hosts[host].update(hvars or {})

    def reconcile(self) -> None:
        for g in list(self.groups.values()):
            if g.name != "all" and not g.parents:
                self._child("all", g.name)
        direct: dict[str, set[str]] = {h: set() for h in self.hosts}
        for g in self.groups.values():
            for h in g.hosts:
                direct.setdefault(h, set()).add(g.name)
        ungrouped = self.groups["ungrouped"]
        drop: set[str] = set()
        for h in self.hosts:
            mine = self._with_ancestors(direct[h])
            if "ungrouped" in mine:
                if mine - {"all", "ungrouped"}:
                    drop.add(h)
            elif mine <= {"all"}:
                ungrouped.hosts.append(h)
                direct[h].add("ungrouped")
        if drop:
            ungrouped.hosts = [h for h in ungrouped.hosts if h not in drop]
            for h in drop:
                direct[h].discard("ungrouped")
        self.freeze(direct)

    def freeze(self, direct: dict[str, set[str]]) -> None:
        """The inventory is read: from here on every group's host order, ancestors and depth, and every host's
        groups, are computed once (reading stays linear in the hosts)."""
        for g in self.groups.values():
            g._frozen = True
        self._groups_of = {h: frozenset(self._with_ancestors(d)) for h, d in direct.items()}
        self._depth: dict[str, int] = {}

    def _with_ancestors(self, names: set[str]) -> set[str]:
        out = set(names)
        for n in names:
            out |= self.groups[n].ancestors()
        return out

    def host_groups(self, host: str) -> set[str]:
        got = getattr(self, "_groups_of", None)
        if got is not None and host in got:
            return set(got[host])
        out: set[str] = set()
        for g in self.groups.values():
            if host in g.hosts:
                out.add(g.name)
                out |= g.ancestors()
        return out

    def depth(self, g: Group) -> int:
        memo = getattr(self, "_depth", None)
        if memo is not None and g.name in memo:
            return memo[g.name]
        d = 0 if not g.parents else 1 + max(self.depth(p) for p in g.parents)
        if memo is not None:
            memo[g.name] = d
        return d

    # -- hosts and patterns ----------------------------------------------------------------------------------
    def get_hosts(self, pattern: str = "all") -> list[HostRef]:
        terms = split_pattern(pattern)
        if terms is None:  # a pattern Ansible reads its own way: ask Ansible, for the names only
            return self._ansible_hosts(pattern)
        regular = [t for t in terms if t[0] not in "!&"] or ["all"]
        names: list[str] = []
        for t in regular + [t for t in terms if t[0] == "&"] + [t for t in terms if t[0] == "!"]:
            that = self._match(t.lstrip("!&"))
            if t[0] == "!":
                names = [n for n in names if n not in that]
            elif t[0] == "&":
                names = [n for n in names if n in that]
            else:
                names.extend(n for n in that if n not in names)
        return [HostRef(n) for n in names]

    def _match(self, name: str) -> list[str]:
        out = self.groups[name].ordered_hosts() if name in self.groups else []
        if (name not in self.groups or "." in name) and name in self.hosts and name not in out:
            out.append(name)
        return out

    def _ansible_hosts(self, pattern: str) -> list[HostRef]:
        if self._ansible is None:
            from ansible.inventory.manager import InventoryManager
            from ansible.parsing.dataloader import DataLoader
            self._ansible = InventoryManager(loader=DataLoader(), sources=[str(self.source)])
        return [HostRef(h.name) for h in self._ansible.get_hosts(pattern)]

    # -- variables -------------------------------------------------------------------------------------------
    def host_vars(self, host: str, base: Path, extra: dict[str, Any]) -> dict[str, Any]:
        mine = self.host_groups(host)
        ordered = sorted((self.groups[n] for n in mine if n != "all"),
                         key=lambda g: (self.depth(g), g.priority, g.name))
        out: dict[str, Any] = dict(self.groups["all"].vars)
        for g in ordered:
            out.update(g.vars)
        out.update(self._group_files(base, "all"))
        for g in ordered:
            out.update(self._group_files(base, g.name))
        out.update(self.hosts[host])
        short = host if IPV4.match(host) else host.split(".")[0]
        out.update(inventory_hostname=host, inventory_hostname_short=short,
                   group_names=sorted(n for n in mine if n != "all"))
        if not host.startswith(os.sep):
            out.update(_vars_files(base / "host_vars", host))
        out.update(extra)
        out.update(groups=self.all_groups(), playbook_dir=os.path.abspath("."))
        return out

    def _group_files(self, base: Path, name: str) -> dict[str, Any]:
        """group_vars/<name>, read once per inventory (every host of the group gets the same mapping's values)."""
        cache = self.__dict__.setdefault("_group_file_cache", {})
        key = (str(base), name)
        if key not in cache:
            cache[key] = _vars_files(base / "group_vars", name)
        return cache[key]

    def all_groups(self) -> dict[str, list[str]]:
        """Every group's hosts in Ansible's order (the ``groups`` variable), computed once."""
        got = self.__dict__.get("_all_groups")
        if got is None:
            got = {n: g.ordered_hosts() for n, g in self.groups.items()}
            self._all_groups = got
        return got


# the variables specdeploy reads from an inventory, rendered as a play renders them before it uses them
CONNECTION_VARS = ("ansible_host", "ansible_port", "ansible_user", "ansible_connection", "ansible_ssh_private_key_file",
                   "ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_ssh_args")


def templated(key: str) -> bool:
    return key.startswith("specdeploy_") or key in CONNECTION_VARS


def split_pattern(pattern: str) -> list[str] | None:
    """The terms of a --limit pattern, or None where Ansible's reading may differ from a plain split."""
    if "," in pattern:
        parts = pattern.split(",")
        if any(":" in p for p in parts):
            return None
    else:
        parts = pattern.split(":")
        if len(parts) > 1 and any(re.fullmatch(r"[!&]?[0-9A-Fa-f]*", p.strip()) for p in parts):
            return None  # an IPv6 address or host:port to Ansible
    terms = [p.strip() for p in parts if p.strip()]
    for t in terms:
        name = t[1:] if t[0] in "!&" else t
        if not NAME.match(name) or name in LOCALHOST:
            return None
    return terms or None


def _vars_files(where: Path, name: str) -> dict[str, Any]:
    """group_vars/<name> or host_vars/<name>: the first of <name>, <name>.yml, .yaml, .json; a directory in
    sorted order (subdirectories without an extension included; hidden and backup files skipped)."""
    if not where.exists():
        return {}
    if not where.is_dir():
        _fail(f"{where} is not a directory")
    files: list[Path] = []
    for ext in VARS_EXTS:
        p = where / (name + ext)
        if p.exists():
            files = _dir_files(p) if p.is_dir() else [p]
            break
    out: dict[str, Any] = {}
    for f in files:
        data = _load_file(f)
        if data is None:
            continue
        if not isinstance(data, dict):
            _fail(f"{f} is not a mapping")
        _plain_data(data, f)
        out.update(data)
    return out


def _dir_files(d: Path) -> list[Path]:
    out: list[Path] = []
    for name in sorted(os.listdir(d)):
        if name.startswith(".") or name.endswith("~"):
            continue
        p, ext = d / name, os.path.splitext(name)[1]
        if p.is_dir() and not ext:
            out.extend(_dir_files(p))
        elif p.is_file() and ext in VARS_EXTS:
            out.append(p)
    return out


def _has_template(obj: Any) -> bool:
    if isinstance(obj, str):
        return any(m in obj for m in TEMPLATE_MARKS)
    if isinstance(obj, dict):
        return any(_has_template(k) or _has_template(v) for k, v in obj.items())
    if isinstance(obj, list):
        return any(_has_template(v) for v in obj)
    return False


def template(value: Any, variables: dict[str, Any], depth: int = 0) -> Any:
    """``{{ name }}`` references as Ansible renders them: a value that is exactly one reference keeps the
    referenced value's type; references inside text join as text (strings and numbers only)."""
    if depth > 20:
        _fail("templates nest too deep")
    if isinstance(value, dict):
        if any(_has_template(k) for k in value):
            _fail("a templated mapping key")
        return {k: template(v, variables, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [template(v, variables, depth + 1) for v in value]
    if not isinstance(value, str) or not _has_template(value):
        return value
    if "\r" in value or value.endswith("\n"):  # how Ansible treats a trailing newline depends on the rest
        _fail(f"template {value!r} ends in a newline")
    rest = REF.sub("", value)
    if any(m in rest for m in TEMPLATE_MARKS) or "}}" in rest:
        _fail(f"template {value!r} is more than a variable reference")

    def lookup(name: str) -> Any:
        if name not in variables or name in ("groups", "playbook_dir"):
            _fail(f"template {value!r} uses {name}, left to Ansible")
        return template(variables[name], variables, depth + 1)

    whole = REF.fullmatch(value)
    if whole:
        got = lookup(whole.group(1))
        if got is None:
            _fail(f"template {value!r} gives None")
        return got

    def text(m: re.Match) -> str:
        got = lookup(m.group(1))
        if isinstance(got, bool) or not isinstance(got, (str, int, float)):
            _fail(f"template {value!r} joins a {type(got).__name__} into text")
        return str(got)
    return REF.sub(text, value)


def read(path: Path, extra: dict[str, Any]) -> tuple[NativeInventory, dict[str, dict[str, Any]]]:
    """(inventory, {host: variables with every specdeploy_* and connection value templated}), or Unsupported."""
    _check_settings(Path.cwd())
    raw = str(path)
    if any(c in raw for c in ",$~") or not raw:
        _fail(f"inventory source {raw!r}")
    if _has_template(extra):
        _fail("-e values with templates")
    _plain_data(extra, Path("-e"))
    src = Path(os.path.normpath(os.path.abspath(raw)))
    inv = NativeInventory(path)
    if src.is_dir():
        if (src / "vars_plugins").exists():
            _fail(f"{src / 'vars_plugins'}")
        files = []
        for name in sorted(os.listdir(src)):
            if name.startswith(".") or name in IGNORED_NAMES or name.endswith(IGNORED_EXTS):
                continue
            p = src / name
            if not p.is_file() or not name.endswith(YAML_EXTS) or os.stat(p).st_mode & 0o111:
                _fail(f"{p} is not a plain YAML inventory file")
            files.append(p)
        if not files:
            _fail(f"{src} has no YAML inventory file")
        base = Path(os.path.realpath(src))
    elif src.is_file():
        if not src.name.endswith(YAML_EXTS) or os.stat(src).st_mode & 0o111:
            _fail(f"{src} is not a plain YAML inventory file")
        files, base = [src], Path(os.path.realpath(src.parent))
    else:
        _fail(f"{src} is neither a file nor a directory")
    for f in files:
        inv.parse_file(f)
    inv.reconcile()
    out: dict[str, dict[str, Any]] = {}
    for h in inv.get_hosts("all"):
        v = inv.host_vars(h.name, base, extra)
        out[h.name] = {k: (template(val, v) if templated(k) else val) for k, val in v.items()}
    return inv, out


def _reach(g: "Group", edge: str) -> set[str]:
    """Names of the groups reachable from g along ``parents`` or ``children`` (g itself only through a loop)."""
    out: set[str] = set()
    todo = list(getattr(g, edge))
    while todo:
        n = todo.pop()
        if n.name not in out:
            out.add(n.name)
            todo.extend(getattr(n, edge))
    return out
