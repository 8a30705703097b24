"""What an inventory must be beyond well-formed files, checked when it is read (both readers): names that are safe
as names, addresses Prometheus and ssh take, and no conflict that Ansible would settle silently.

Errors (the inventory is refused, naming the host, group, file or variable and the fix):

- a host or group name that cannot be a path component or a plain word on a command line: empty, ``.`` or
  ``..``, a ``/`` or ``\\``, a control, invisible or white-space character, a character outside ASCII (a
  look-alike such as Cyrillic ``а`` for Latin ``a``, or a zero-width space), a leading ``.`` or ``-``;
- an ``ansible_host`` that is not an IP address or a host name (an IPv6 address with a zone, or in brackets);
- ``<name>.yml`` beside ``<name>.yaml`` (or ``.json``, or a bare file ``<name>``) in group_vars/ or host_vars/:
  Ansible reads the first of them (``<name>``, ``.yml``, ``.yaml``, ``.json``) and ignores the others silently;
- a variable that Ansible reserves (:data:`RESERVED`) set in the inventory, its vars files or ``-e``;
- a host in two groups that are not parent and child, of one priority, that give a ``specdeploy_*`` variable two
  values (Ansible takes the later group by name: the order of the alphabet decides the engine).

Named warnings (shown by preflight, plan and deploy): a directory ``<name>/`` beside a file ``<name>.yml`` (Ansible
reads the directory only), host_vars for a host that is not in the inventory (its variables reach nobody), two
engine hosts whose names differ only in case, two engine hosts with one ``ansible_host`` and port (one machine would
get two engines).
"""
from __future__ import annotations

import ipaddress
import os
import re
import unicodedata
from pathlib import Path
from typing import Any

from specdeploy.values.errors import Finding
from specdeploy.values.terminal import safe

RESERVED = ("inventory_dir", "inventory_file", "inventory_hostname", "inventory_hostname_short", "groups",
            "group_names", "hostvars", "playbook_dir", "omit", "ansible_play_hosts", "ansible_play_batch",
            "play_hosts", "role_path")
HOST_CHARS = re.compile(r"[A-Za-z0-9._:-]+\Z")
GROUP_CHARS = re.compile(r"[A-Za-z0-9._-]+\Z")
HOSTNAME = re.compile(r"(?=.{1,253}\Z)([A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)(\.[A-Za-z0-9_]"
                      r"([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?\Z")
VARS_EXTS = ("", ".yml", ".yaml", ".json")
# a few look-alikes, to say what a name resembles (any character outside ASCII is refused anyway)
_LOOKS = str.maketrans({"а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "і": "i", "ј": "j",
                        "ѕ": "s", "ԁ": "d", "ɡ": "g", "һ": "h", "ӏ": "l", "ᴏ": "o", "Α": "A", "Β": "B", "Ε": "E",
                        "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N", "Ο": "O", "Ρ": "P", "Τ": "T", "Χ": "X",
                        "Υ": "Y", "Ζ": "Z", "ο": "o", "ν": "v"})
NAME_FIX = "rename it to letters, digits, '.', '-' and '_' (not starting with '.' or '-'), as a DNS name is written"


def name_problem(name: Any, kind: str = "host") -> str | None:
    """Why ``name`` cannot be a host (or group) name, or None."""
    if not isinstance(name, str) or not name:
        return "is empty"
    if name in (".", ".."):
        return "is a relative path component ('.' or '..'); it would lead a path out of its directory"
    if "/" in name or "\\" in name:
        return "holds a path separator ('/' or '\\'); it would lead a path out of its directory"
    bad = [c for c in name if unicodedata.category(c)[0] in "CZ" or c.isspace()]
    if bad:
        return "holds control, invisible or white-space characters (" + ", ".join(
            sorted({safe(c) if safe(c) != c else repr(c) for c in bad})) + ")"
    if not name.isascii():
        plain = unicodedata.normalize("NFKC", name).translate(_LOOKS)
        like = f" (it looks like '{plain}')" if plain.isascii() and plain != name else ""
        return f"holds characters outside ASCII{like}; a look-alike name is another host to ssh and DNS"
    if name[0] in ".-":
        return (f"starts with '{name[0]}' ("
                + ("a hidden file where it becomes a path" if name[0] == "." else "read as an option by ssh and "
                   "the tools it is passed to") + ")")
    chars = HOST_CHARS if kind == "host" else GROUP_CHARS
    if not chars.match(name):
        odd = sorted({c for c in name if not chars.match(c)})
        return f"holds {', '.join(repr(c) for c in odd)}, which is not part of a {kind} name"
    if len(name) > 253:
        return f"is {len(name)} characters long (a host name has at most 253)"
    return None


def address_problem(addr: Any) -> str | None:
    """Why ``ansible_host`` cannot be used as an address (in a URL, a Prometheus target, an ssh line), or None."""
    if isinstance(addr, bool) or not isinstance(addr, (str, int)):
        return f"is a {type(addr).__name__}, not an address"
    a = str(addr)
    if a.startswith("[") or a.endswith("]"):
        return "is in brackets; give the IPv6 address without them (specdeploy adds them where a URL needs them)"
    if "%" in a:
        return "has a zone (%); Prometheus cannot scrape a link-local address with a zone, give a global address"
    try:
        ipaddress.ip_address(a)
        return None
    except ValueError:
        pass
    if not a.isascii() or not HOSTNAME.match(a) or a.startswith("-"):
        return "is neither an IP address nor a host name"
    return None


def _error(subject: str, message: str, fix: str, host: str | None = None) -> Finding:
    return Finding("error", subject, message, fix, host)


def check_names(hosts: dict[str, dict], groups: list[str], where: str = "") -> list[Finding]:
    """Errors for unsafe host and group names and unusable ansible_host values (``where``: the file, named in
    each finding)."""
    out: list[Finding] = []
    at = f"{safe(where)}: " if where else ""
    for h, variables in hosts.items():
        why = name_problem(h, "host")
        if why:
            out.append(_error(f"{at}inventory host {safe(h)!s}", f"the host name {why}", NAME_FIX))
            continue
        if isinstance(variables, dict) and "ansible_host" in variables:
            why = address_problem(variables["ansible_host"])
            if why:
                out.append(_error("ansible_host", f"{safe(variables['ansible_host'])} {why}",
                                  "give an IPv4 or IPv6 address, or a host name", h))
    for g in groups:
        why = name_problem(g, "group")
        if why:
            out.append(_error(f"{at}inventory group {safe(g)}", f"the group name {why}", NAME_FIX))
    return out


def vars_files(base: Path, kind: str) -> dict[str, list[Path]]:
    """{name: [its files and directories]} in group_vars/ or host_vars/ beside the inventory, in the order Ansible
    looks for them (``<name>``, ``.yml``, ``.yaml``, ``.json``): Ansible reads the first only."""
    d = base / kind
    out: dict[str, list[Path]] = {}
    if not d.is_dir():
        return out
    names: set[str] = set()
    for entry in os.listdir(d):
        if entry.startswith(".") or entry.endswith("~"):
            continue
        stem, ext = os.path.splitext(entry)
        names.add(stem if ext in VARS_EXTS[1:] else entry)
    for name in sorted(names):
        found = [d / (name + ext) for ext in VARS_EXTS if os.path.lexists(d / (name + ext))]
        if found:
            out[name] = found
    return out


def _load(path: Path) -> dict:
    """A vars file (or directory of them) as a mapping, vault values opaque; {} when it cannot be read (the
    reader that Ansible's files go through reports that in its own words)."""
    from specdeploy.hostvars.inventory_files import SpecdeployError, checked_text
    from specdeploy.hostvars.varsfile import load
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in VARS_EXTS and
                   not p.name.startswith(".")) if path.is_dir() else [path]
    out: dict = {}
    for f in files:
        try:
            text = checked_text(f)
            if text.lstrip().startswith("$ANSIBLE_VAULT"):
                continue
            out.update(load(text, str(f)))
        except (SpecdeployError, OSError):
            continue
    return out


def check_conflicts(inv, base: Path, hosts: dict[str, Any], extra: dict, engine_group: str
                    ) -> tuple[list[Finding], list[Finding]]:
    """(errors, warnings) for the conflicts of the module's list. ``inv``: either reader's inventory (its
    ``groups`` and ``get_hosts``); ``base``: the directory holding group_vars/ and host_vars/."""
    errors: list[Finding] = []
    warnings: list[Finding] = []
    group_files = vars_files(base, "group_vars")
    host_files = vars_files(base, "host_vars")
    for kind, found in (("group_vars", group_files), ("host_vars", host_files)):
        for name, files in found.items():
            if len(files) < 2:
                continue
            ignored = ", ".join(safe(f.name) for f in files[1:])
            if files[0].is_dir():
                errors.append(_error(str(files[1]), f"{kind}/{safe(name)}/ is a directory, so Ansible reads it and "
                                     f"ignores {ignored} beside it without a word", f"move {ignored} into "
                                     f"{kind}/{safe(name)}/ (Ansible reads every file there)"))
            else:
                errors.append(_error(str(files[1]), f"{kind}/{safe(name)} is given by {len(files)} files ("
                                     + ", ".join(safe(f.name) for f in files) + f"); Ansible reads "
                                     f"{safe(files[0].name)} and ignores the rest without a word",
                                     f"merge them into one file {safe(name)}.yml"))
    for name, files in host_files.items():
        if name not in hosts:
            warnings.append(Finding("warning", str(files[0]), f"host_vars for {safe(name)}, which is not a host of "
                                    "the inventory: its variables reach no host",
                                    "rename it after the host it is meant for, or remove it"))
    group_vars = {g: {**_inventory_group_vars(inv, g), **(_load(group_files[g][0]) if g in group_files else {})}
                  for g in ["all", *_groups(inv)]}
    sources = [(f"-e {k}", k) for k in extra]
    sources += [(f"group {g}", k) for g, v in group_vars.items() for k in v]
    for name, files in host_files.items():
        sources += [(str(files[0]), k) for k in _load(files[0])]
    sources += [(f"host {h}", k) for h in hosts for k in _inventory_host_vars(inv, h)]
    for where, k in sources:
        if k in RESERVED:
            errors.append(_error(safe(where), f"sets {k}, a name Ansible reserves for its own value",
                                 f"rename the variable (e.g. my_{k})"))
    errors += _group_disagreements(inv, hosts, {g: v for g, v in group_vars.items() if g != "all"})
    warnings += _engine_host_warnings(inv, hosts, engine_group)
    return errors, warnings


def _groups(inv) -> list[str]:
    return [g for g in getattr(inv, "groups", {}) if g not in ("all", "ungrouped")]


def _inventory_group_vars(inv, g: str) -> dict:
    grp = getattr(inv, "groups", {}).get(g)
    return dict(getattr(grp, "vars", {}) or {})


def _inventory_host_vars(inv, h: str) -> dict:
    native = getattr(inv, "hosts", None)
    if isinstance(native, dict) and isinstance(native.get(h), dict):
        return {k: v for k, v in native[h].items() if k not in ("inventory_file", "inventory_dir")}
    try:
        host = inv.get_host(h)
    except Exception:  # noqa: BLE001 - not every reader knows the host the same way
        return {}
    return {k: v for k, v in (getattr(host, "vars", {}) or {}).items() if k not in ("inventory_file", "inventory_dir")}


def _ancestry(inv, g: str) -> set[str]:
    grp = inv.groups.get(g)
    if grp is None:
        return set()
    if hasattr(grp, "ancestors"):
        return set(grp.ancestors())
    return {a.name for a in grp.get_ancestors()}


def _host_groups(inv, h: str) -> set[str]:
    if hasattr(inv, "host_groups"):
        return inv.host_groups(h) - {"all", "ungrouped"}
    host = inv.get_host(h)
    return {g.name for g in host.get_groups()} - {"all", "ungrouped"} if host is not None else set()


def _group_disagreements(inv, hosts: dict, group_vars: dict[str, dict]) -> list[Finding]:
    out: list[Finding] = []
    seen: set[tuple] = set()
    for h in hosts:
        mine = sorted(_host_groups(inv, h))
        for i, a in enumerate(mine):
            for b in mine[i + 1:]:
                if a in _ancestry(inv, b) or b in _ancestry(inv, a):
                    continue  # a child overriding its parent is how inventories are meant to be written
                pa = getattr(inv.groups.get(a), "priority", 1)
                pb = getattr(inv.groups.get(b), "priority", 1)
                if pa != pb:
                    continue
                va, vb = group_vars.get(a, {}), group_vars.get(b, {})
                for k in sorted(set(va) & set(vb)):
                    if k.startswith("specdeploy_") and va[k] != vb[k] and (a, b, k) not in seen:
                        seen.add((a, b, k))
                        out.append(_error(k, f"groups {safe(a)} and {safe(b)} give it two values ({safe(va[k])!s} "
                                          f"and {safe(vb[k])!s}) and the host is in both; Ansible would take "
                                          f"{safe(max(a, b))}'s for the order of the group names alone",
                                          "set it in one of the groups only, in host_vars, or give one group a "
                                          "higher ansible_group_priority", h))
    return out


def _engine_host_warnings(inv, hosts: dict, engine_group: str) -> list[Finding]:
    out: list[Finding] = []
    try:
        engine_hosts = [h.name for h in inv.get_hosts(engine_group)]
    except Exception:  # noqa: BLE001 - a pattern the reader cannot take: no engine hosts to compare
        return out
    by_case: dict[str, str] = {}
    by_addr: dict[tuple, str] = {}
    for h in engine_hosts:
        other = by_case.setdefault(h.lower(), h)
        if other != h:
            out.append(Finding("warning", "inventory host", f"{safe(h)} and {safe(other)} differ only in case; DNS "
                               "takes them for one name", "give the hosts names that differ in more than case", h))
        v = hosts.get(h) if isinstance(hosts.get(h), dict) else {}
        key = (str(v.get("ansible_host", h)).lower(), str(v.get("ansible_port", 22)))
        other = by_addr.setdefault(key, h)
        if other != h:
            out.append(Finding("warning", "ansible_host", f"{safe(h)} and {safe(other)} both reach {safe(key[0])} "
                               f"(port {key[1]}): one machine would run both hosts' engines on the same ports",
                               "give each engine host its own machine (ansible_host)", h))
    return out


def prescan(path: Path) -> list[Finding]:
    """check_names over the host and group names the inventory's own files declare (YAML and INI), before
    either reader parses them: Ansible drops a file whose names it cannot parse with a warning, which would leave
    the bad name unnamed and the inventory short of hosts."""
    from specdeploy.hostvars.inventory_files import SpecdeployError, checked_text
    from specdeploy.hostvars.inventory_native import IGNORED_EXTS, IGNORED_NAMES
    files = [path] if path.is_file() else sorted(
        p for p in path.iterdir() if p.is_file() and not p.name.startswith(".") and p.name not in IGNORED_NAMES
        and not p.name.endswith(IGNORED_EXTS)) if path.is_dir() else []
    out: list[Finding] = []
    for f in files:
        try:
            text = checked_text(f)
        except (SpecdeployError, OSError):
            continue  # the readers report it in their own words
        hosts: dict[str, dict] = {}
        groups: list[str] = []
        if not _yaml_names(text, hosts, groups) and f.suffix not in (".yml", ".yaml", ".json"):
            _ini_names(text, hosts, groups)
        out += check_names(hosts, groups, str(f))
    return out


_RANGE = re.compile(r"\[([A-Za-z0-9]+):[A-Za-z0-9]+(?::\d+)?\]")


def _yaml_names(text: str, hosts: dict, groups: list) -> bool:
    """Collect the names of a YAML inventory; False when ``text`` is not one (not YAML, not a mapping of
    groups)."""
    import yaml

    try:
        data = yaml.load(text, Loader=_names_loader())  # noqa: S506 (a SafeLoader with opaque vault tags)
    except (yaml.YAMLError, RecursionError):
        return False
    if not isinstance(data, dict) or "plugin" in data or not all(isinstance(v, (dict, type(None)))
                                                                  for v in data.values()):
        return False
    todo = list(data.items())
    while todo:
        name, body = todo.pop()
        groups.append(str(name)) if isinstance(name, str) else None
        if not isinstance(body, dict):
            continue
        for h, hv in (body.get("hosts") or {}).items() if isinstance(body.get("hosts"), dict) else ():
            if isinstance(h, str):  # a range (gpu-[01:08]) is checked as its first host
                hosts[_RANGE.sub(lambda m: m.group(1), h)] = \
                    {k: v for k, v in hv.items() if k == "ansible_host"} if isinstance(hv, dict) else {}
        kids = body.get("children")
        if isinstance(kids, dict):
            todo.extend(kids.items())
    return True


def _names_loader():
    """varsfile's loader (a SafeLoader that reads ``!vault`` and ``!unsafe`` as opaque text) on libyaml where it is
    there: a fleet's hosts.yml is read here before either reader reads it, and the pure-Python loader took longer
    than the reader itself."""
    import yaml

    from specdeploy.hostvars.varsfile import _Loader, _opaque
    base = getattr(yaml, "CSafeLoader", None)
    if base is None:
        return _Loader
    global _C_LOADER
    if _C_LOADER is None:
        _C_LOADER = type("_CNamesLoader", (base,), {})
        _C_LOADER.add_constructor("!vault", _opaque)
        _C_LOADER.add_constructor("!unsafe", _opaque)
    return _C_LOADER


_C_LOADER = None


def _ini_names(text: str, hosts: dict, groups: list) -> None:
    section = "hosts"
    for line in text.splitlines():
        s = line.strip()
        if not s or s[0] in "#;":
            continue
        if s.startswith("[") and s.endswith("]") and not s.startswith(("[[", "[{", '["')) and "," not in s:
            section = s[1:-1]
            name, _, kind = section.partition(":")
            groups.append(name)
            section = kind or "hosts"
            continue
        token = s.split()[0]
        if section == "children":
            groups.append(token)
        elif section == "hosts":  # a range (gpu-[01:08]) is checked as its first host
            host = _RANGE.sub(lambda m: m.group(1), token)
            hosts[host.rsplit(":", 1)[0] if host.count(":") == 1 else host] = {}
