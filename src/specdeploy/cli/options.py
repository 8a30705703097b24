"""What every command shares: the options -i, -e, --limit, --json, --vault-id and --vault-password-file, defined
once, and the one error path.

Every error a command reports is a ``Finding`` (the file or field, what is wrong, the fix) printed on stderr,
followed by a non-zero exit; never a traceback."""
from __future__ import annotations

import sys
from typing import NoReturn

import typer

from specdeploy.values.errors import Finding, SpecdeployError

INVENTORY_HELP = "Ansible inventory directory or file."
Inventory = typer.Option(..., "-i", "--inventory", help=INVENTORY_HELP)
ExtraVars = typer.Option(None, "-e", "--extra-vars",
                         help="KEY=VALUE, a JSON/YAML mapping, or @file.yml, like ansible-playbook -e.")
VaultIds = typer.Option(None, "--vault-id", help="Vault secret LABEL@FILE, FILE or LABEL@prompt, like ansible-playbook "
                        "--vault-id (repeatable); vault_identity_list in ansible.cfg and ANSIBLE_VAULT_IDENTITY_LIST "
                        "are read too.")
VaultPasswordFiles = typer.Option(None, "--vault-password-file", help="Vault password file (or an executable that "
                                  "prints it), like ansible-playbook --vault-password-file (repeatable); "
                                  "ANSIBLE_VAULT_PASSWORD_FILE and vault_password_file in ansible.cfg are read too.")
Limit = typer.Option(None, "--limit", help="Hosts or groups, like ansible-playbook --limit.")
Json = typer.Option(False, "--json", help="Print JSON.")
ENGINE_HELP = "Engine: vllm or sglang."
ENGINE_VERSION_HELP = "The engine's release, e.g. 0.16.0 (vLLM) or 0.5.23 (SGLang)."
# An earlier spelling of --engine-version some commands took; deployed units may still call it
LegacyVersion = typer.Option(None, "--version", hidden=True, help="Old spelling of --engine-version.")


def engine_version(new: str | None, old: str | None, required: bool = True) -> str | None:
    """--engine-version, or the old --version a deployed unit may still give; one of them when ``required``."""
    if new and old and new != old:
        error("--engine-version", f"given twice, as {new} and (as --version) {old}", "give --engine-version once")
    v = new or old
    if required and not v:
        error("--engine-version", "is required", "give the engine's release, e.g. --engine-version 0.16.0")
    return v


def inventory_optional(help: str = INVENTORY_HELP):
    """-i for the commands where the inventory is one source among others."""
    return typer.Option(None, "-i", "--inventory", help=help)


def vault(ids: list[str] | None, password_files: list[str] | None):
    """The vault secrets of --vault-id and --vault-password-file."""
    from specdeploy.hostvars.inventory_ansible import Vault
    return Vault.of(ids, password_files)


def print_findings(exc: SpecdeployError) -> None:
    for p in exc.problems:
        print(p.line(), file=sys.stderr)


def fail(exc: SpecdeployError, code: int = 2) -> NoReturn:
    """Print each finding of ``exc`` on stderr and exit with ``code`` (2: bad input)."""
    print_findings(exc)
    raise typer.Exit(code)


def error(subject: str, message: str, fix: str = "", code: int = 2) -> NoReturn:
    """One finding: ``subject`` names the file or field, ``fix`` says what to do."""
    fail(SpecdeployError([Finding("error", subject, message, fix)]), code)


def known_engine(engine: str, option: str = "--engine") -> None:
    from specdeploy.engines import names
    if engine not in names():
        error(option, f"unknown engine '{engine}'", f"use {' or '.join(names())}")


def finite(value: float, option: str, minimum: float | None = None, above: bool = False) -> float:
    """A float option that must be a finite number (at least, or with ``above`` more than, ``minimum``): the
    check of :func:`specdeploy.hostvars.argcheck.finite`, as a command's bad-input exit."""
    import math

    from specdeploy.hostvars.argcheck import finite as check
    try:
        return check(value, option, -math.inf if minimum is None else minimum, positive=above)
    except SpecdeployError as exc:
        fail(exc)


def output_dir(path, option: str, what: str = "a directory to write"):
    """An output directory: absent (it is made) or a directory; not a file, a dangling link or under a file."""
    from pathlib import Path
    path = Path(path)
    if path.is_symlink() and not path.exists():
        error(option, f"{path} is a dangling symbolic link", f"remove it or give {what}")
    if path.exists() and not path.is_dir():
        error(option, f"{path} is not a directory", f"give {what}")
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        error(option, f"{parent} is not a directory", f"give {what}")
    return path
