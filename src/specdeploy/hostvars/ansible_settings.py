"""Which Ansible settings leave the variables a host gets unchanged, so the native inventory reader may ignore them.

The classification is ours and short: ``VARIABLE_SETTINGS`` names the settings of ansible-core's own definitions
(``ansible/config/base.yml``) that change which variables a host gets or how they are read (inventory sources and
plugins, vars plugins, precedence, hash merging, templating, YAML parsing, fact caching), and the options of its
inventory, vars and cache plugins count as such too. Every other setting and every other builtin plugin's option
(connections, callbacks, become, strategies, colours, galaxy, ...) is harmless.

The names themselves are facts of the installed release, generated from its files (no Ansible import) into
``ansible_settings.json``: ``python -m specdeploy.hostvars.ansible_settings`` writes it, and a contract test
regenerates it against the installed ansible-core, so a setting that a new release adds is classified here before
the reader trusts it. A name in neither list (a setting of another release, a typo) is not trusted: the reader
steps aside for Ansible's own, as before.
"""
from __future__ import annotations

import ast
import json
import sys
from functools import lru_cache
from pathlib import Path

import yaml

TABLE = Path(__file__).with_name("ansible_settings.json")
# settings (their names in ansible-core's base.yml) that change which variables a host gets, or how they are read
VARIABLE_SETTINGS = frozenset({
    "ALLOW_EMBEDDED_TEMPLATES", "ANSIBLE_HOME", "CACHE_PLUGIN", "CACHE_PLUGIN_CONNECTION", "CACHE_PLUGIN_PREFIX",
    "CACHE_PLUGIN_TIMEOUT", "DEFAULT_CACHE_PLUGIN_PATH", "DEFAULT_HASH_BEHAVIOUR", "DEFAULT_HOST_LIST",
    "DEFAULT_INVENTORY_PLUGIN_PATH", "DEFAULT_JINJA2_EXTENSIONS", "DEFAULT_JINJA2_NATIVE",
    "DEFAULT_NULL_REPRESENTATION", "DEFAULT_UNDEFINED_VAR_BEHAVIOR", "DEFAULT_VARS_PLUGIN_PATH",
    "DUPLICATE_YAML_DICT_KEY", "HOST_PATTERN_MISMATCH", "INJECT_FACTS_AS_VARS", "INVENTORY_ANY_UNPARSED_IS_FAILED",
    "INVENTORY_ENABLED", "INVENTORY_IGNORE_EXTS", "INVENTORY_IGNORE_PATTERNS", "INVENTORY_UNPARSED_IS_FAILED",
    "PLAYBOOK_DIR", "PLAYBOOK_VARS_ROOT", "RUN_VARS_PLUGINS", "STRING_TYPE_FILTERS", "TRANSFORM_INVALID_GROUP_CHARS",
    "VARIABLE_PLUGINS_ENABLED", "VARIABLE_PRECEDENCE", "YAML_FILENAME_EXTENSIONS", "_TEMPLAR_SANDBOX_MODE",
    "_TEMPLAR_UNKNOWN_TYPE_CONVERSION", "_TEMPLAR_UNKNOWN_TYPE_ENCOUNTERED", "_TEMPLAR_UNTRUSTED_TEMPLATE_BEHAVIOR",
})
# plugin types whose options change the variables a host gets
VARIABLE_PLUGIN_TYPES = ("inventory", "vars", "cache")


@lru_cache(maxsize=1)
def harmless() -> tuple[frozenset[str], frozenset[tuple[str, str]]]:
    """(environment variable names, (ansible.cfg section, key) pairs) that leave a host's variables unchanged."""
    try:
        t = json.loads(TABLE.read_text())
        return frozenset(t["harmless_env"]), frozenset(tuple(x.split(".", 1)) for x in t["harmless_ini"])
    except (OSError, ValueError, KeyError, TypeError):
        return frozenset(), frozenset()  # no table: nothing is trusted, the reader steps aside


def _literal(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _docs(path: Path) -> dict[str, str]:
    """The documentation strings a plugin or doc-fragment file assigns, by name (class attributes included)."""
    out = {}
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return out
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            text = _literal(node.value)
            if text is not None:
                out[node.targets[0].id] = text
    return out


def _options(doc: str) -> tuple[dict, list[str]]:
    try:
        d = yaml.safe_load(doc) or {}
    except yaml.YAMLError:
        return {}, []
    if not isinstance(d, dict):
        return {}, []
    ext = d.get("extends_documentation_fragment") or []
    options = d.get("options") if isinstance(d.get("options"), dict) else {}
    return options, [ext] if isinstance(ext, str) else [e for e in ext if isinstance(e, str)]


def _names(options: dict) -> tuple[set[str], set[str]]:
    env, ini = set(), set()
    for opt in options.values():
        if isinstance(opt, dict):
            env |= {e["name"] for e in opt.get("env") or [] if isinstance(e, dict) and "name" in e}
            ini |= {f"{i['section']}.{i['key']}" for i in opt.get("ini") or []
                    if isinstance(i, dict) and "section" in i and "key" in i}
    return env, ini


def generate(ansible_dir: Path, version: str) -> dict:
    """The table from an ansible-core tree: every setting's and builtin plugin option's environment and ini names,
    split by the classification above (a name that any variable-changing setting uses is not harmless)."""
    base = yaml.safe_load((ansible_dir / "config" / "base.yml").read_text(encoding="utf-8"))
    ok_env, ok_ini, var_env, var_ini = set(), set(), set(), set()
    for name, d in base.items():
        env, ini = _names({name: d})
        if name in VARIABLE_SETTINGS:
            var_env |= env
            var_ini |= ini
        else:
            ok_env |= env
            ok_ini |= ini
    fragments = {}
    for f in sorted((ansible_dir / "plugins" / "doc_fragments").glob("*.py")):
        for attr, text in _docs(f).items():
            fragments[f.stem if attr == "DOCUMENTATION" else f"{f.stem}.{attr.lower()}"] = text
    for kind_dir in sorted(p for p in (ansible_dir / "plugins").iterdir() if p.is_dir()):
        if kind_dir.name == "doc_fragments":
            continue
        variable = kind_dir.name in VARIABLE_PLUGIN_TYPES
        for f in sorted(kind_dir.glob("*.py")):
            doc = _docs(f).get("DOCUMENTATION")
            if not doc:
                continue
            options, ext = _options(doc)
            env, ini = _names(options)
            for e in ext:
                fopts, _ = _options(fragments.get(e.removeprefix("ansible.builtin."), ""))
                fe, fi = _names(fopts)
                env, ini = env | fe, ini | fi
            if variable:
                var_env |= env
                var_ini |= ini
            else:
                ok_env |= env
                ok_ini |= ini
    return {"ansible_core": version, "settings": sorted(base),
            "harmless_env": sorted(ok_env - var_env), "harmless_ini": sorted(ok_ini - var_ini),
            "variable_env": sorted(var_env), "variable_ini": sorted(var_ini)}


@lru_cache(maxsize=1)
def installed() -> dict:
    """The table for the ansible-core installed beside this Python."""
    import importlib.metadata
    import importlib.util
    spec = importlib.util.find_spec("ansible")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("ansible-core is not installed here")
    return generate(Path(list(spec.submodule_search_locations)[0]), importlib.metadata.version("ansible-core"))


def main() -> int:
    table = installed()
    harmless_settings = set(table["settings"]) - VARIABLE_SETTINGS
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {TABLE}: ansible-core {table['ansible_core']}, {len(table['harmless_env'])} harmless and "
          f"{len(table['variable_env'])} variable-changing environment names ({len(harmless_settings)} settings "
          "harmless)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
