"""What reading an inventory through Ansible's API needs beyond the API itself: vault secrets found as
``ansible-playbook`` finds them, and a file loader that holds every file to ``inventory_files``' rules.

Vault secrets, in Ansible's order: ``vault_identity_list`` (ansible.cfg) or ``ANSIBLE_VAULT_IDENTITY_LIST``, then
``--vault-id``; then ``--vault-password-file`` and ``vault_password_file`` (ansible.cfg) or
``ANSIBLE_VAULT_PASSWORD_FILE``. An id is ``label@source`` or ``source``; a source is a password file, an
executable that prints the password, or ``prompt``."""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from specdeploy.values.errors import Finding, SpecdeployError
from specdeploy.hostvars.inventory_files import (check_text, decode, group_loop, loop_in, read_bytes,
                                                 scan_inventory_file_groups)

VAULT_FIX = ("give the vault password with --vault-password-file FILE or --vault-id LABEL@FILE (or set "
             "ANSIBLE_VAULT_PASSWORD_FILE, or vault_password_file in ansible.cfg), the one the value was encrypted "
             "with")


@dataclass(frozen=True)
class Vault:
    """The vault secrets given on the command line (``--vault-id``, ``--vault-password-file``)."""
    ids: tuple[str, ...] = ()
    password_files: tuple[str, ...] = ()

    @classmethod
    def of(cls, ids: list[str] | None = None, password_files: list[str] | None = None) -> "Vault":
        return cls(tuple(ids or ()), tuple(password_files or ()))

    def playbook_args(self) -> list[str]:
        """Options that give ``ansible-playbook`` every secret specdeploy read the inventory with, the ones from
        ansible.cfg and the environment included (a run may read another ansible.cfg), with absolute paths."""
        from ansible import constants as C
        args: list[str] = []
        for slug in [*(C.DEFAULT_VAULT_IDENTITY_LIST or []), *self.ids]:
            label, source = _split(slug)
            if source in ("prompt", "prompt_ask_vault_pass"):  # the runner's child has no terminal to ask on
                raise SpecdeployError([Finding(
                    "error", "--vault-id", f"'{slug}' asks for the password at a prompt, which ansible-playbook "
                    "cannot show under specdeploy deploy|rollback|verify",
                    "give the password in a file (--vault-id LABEL@FILE or --vault-password-file FILE), or run "
                    "ansible-playbook directly")])
            args += ["--vault-id", f"{label}@{_abs(source)}" if label else _abs(source)]
        for f in [*self.password_files, *([C.DEFAULT_VAULT_PASSWORD_FILE] if C.DEFAULT_VAULT_PASSWORD_FILE else [])]:
            args += ["--vault-password-file", _abs(f)]
        return args


def _split(slug: str) -> tuple[str | None, str]:
    if "@" not in slug:
        return None, slug
    label, source = slug.split("@", 1)
    return label, source


def _abs(source: str) -> str:
    return source if source in ("prompt", "prompt_ask_vault_pass") else os.path.abspath(os.path.expanduser(source))


def vault_secrets(loader, vault: Vault | None) -> list:
    """[(label, secret)] as ansible-playbook builds them. A password file that cannot be read is refused (Ansible
    warns and goes on when another secret loads)."""
    from ansible import constants as C
    from ansible.errors import AnsibleError
    from ansible.parsing.vault import PromptVaultSecret, get_file_vault_secret
    vault = vault or Vault()
    slugs = [*(C.DEFAULT_VAULT_IDENTITY_LIST or []), *vault.ids]
    files = [*vault.password_files, *([C.DEFAULT_VAULT_PASSWORD_FILE] if C.DEFAULT_VAULT_PASSWORD_FILE else [])]
    slugs += [f"{C.DEFAULT_VAULT_IDENTITY}@{f}" for f in files]
    out: list = []
    for slug in slugs:
        label, source = _split(slug)
        label = label or C.DEFAULT_VAULT_IDENTITY
        try:
            if source in ("prompt", "prompt_ask_vault_pass"):
                secret = PromptVaultSecret(prompt_formats=[f"Vault password ({label}): "], vault_id=label)
            else:
                secret = get_file_vault_secret(filename=source, vault_id=label, loader=loader)
                _bound_script(secret)
            secret.load()
        except (AnsibleError, OSError) as exc:
            msg = (str(getattr(exc, "message", "") or exc).strip().splitlines() or ["cannot be read"])[0]
            raise SpecdeployError([Finding("error", f"vault id {slug}", f"the vault secret cannot be read: {msg}",
                                           "give an existing password file (or an executable that prints the "
                                           "password) to --vault-password-file / --vault-id")]) from None
        out.append((label, secret))
        loader.set_vault_secrets(out)
    return out


VAULT_SCRIPT_S = 60.0  # how long a vault password script may take to print the password


def _bound_script(secret) -> None:
    """A vault password script (or client script) that does not answer within :data:`VAULT_SCRIPT_S` is killed
    and refused, naming it; Ansible itself would wait for it forever."""
    import subprocess

    from ansible.errors import AnsibleError
    from ansible.parsing.vault import ClientScriptVaultSecret, ScriptVaultSecret
    if not isinstance(secret, ScriptVaultSecret):
        return
    client = isinstance(secret, ClientScriptVaultSecret)

    def run(command):
        try:
            p = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE if client else None)
        except OSError as exc:
            raise AnsibleError(f"cannot run the vault password script {secret.filename} ({exc.strerror or exc})"
                               ) from None
        try:
            out, err = p.communicate(timeout=VAULT_SCRIPT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            try:
                p.communicate(timeout=2)
            except subprocess.TimeoutExpired:
                pass
            raise AnsibleError(f"the vault password script {secret.filename} did not answer within "
                               f"{VAULT_SCRIPT_S:g} s") from None
        return out, err, p
    secret._run = run


@contextmanager
def vault_context(secrets: list) -> Iterator[None]:
    """Ansible decrypts an inline ``!vault`` value when it is used, with the secrets of the process-wide
    VaultSecretsContext (ansible-playbook sets it once); hold ours while the values are read."""
    from ansible.parsing.vault import VaultSecretsContext
    prev = VaultSecretsContext._current
    VaultSecretsContext._current = VaultSecretsContext(secrets)
    try:
        yield
    finally:
        VaultSecretsContext._current = prev


def guarded_loader(source: Path, vault: Vault | None, groups: bool = True):
    """A DataLoader with the vault secrets set that reads each file through ``inventory_files`` and keeps the
    group tree of the YAML inventory files it loads (Ansible drops a file whose groups loop, with a warning)."""
    from ansible.errors import AnsibleError
    from ansible.parsing.dataloader import DataLoader
    from ansible.parsing.vault import AnsibleVaultError

    root = os.path.realpath(source)
    vars_dirs = tuple(os.path.join(root if os.path.isdir(root) else os.path.dirname(root), d) + os.sep
                      for d in ("group_vars", "host_vars"))

    class Loader(DataLoader):
        def __init__(self):
            super().__init__()
            self.refused: list[Finding] = []
            self.children: dict[str, list[str]] = {}
            self.loop_file = ""

        def _get_file_contents(self, file_name):
            path = self.path_dwim(file_name)
            try:
                read_bytes(path)  # refuses a FIFO, a device or an oversized file before Ansible opens it
            except SpecdeployError as exc:
                self._refuse(exc)
            try:
                data, plain = super()._get_file_contents(file_name)
            except AnsibleVaultError:
                why = ("none of the vault secrets given decrypts it (a wrong password, or another vault id?)"
                       if self._vault.secrets else "no vault secret was given")
                self._refuse(SpecdeployError([Finding("error", path, f"is vault-encrypted and cannot be decrypted: "
                                                      f"{why}", VAULT_FIX)]))
            try:
                check_text(path, decode(path, data))
            except SpecdeployError as exc:
                self._refuse(exc)
            return data, plain

        def load_from_file(self, file_name, *args, **kwargs):
            data = super().load_from_file(file_name, *args, **kwargs)
            path = os.path.realpath(self.path_dwim(file_name))
            if groups and (path == root or path.startswith(root + os.sep)) and not path.startswith(vars_dirs):
                before = {g: list(c) for g, c in self.children.items()}
                for g, kids in scan_inventory_file_groups(data).items():
                    self.children.setdefault(g, []).extend(kids)
                if loop_in(self.children) and not loop_in(before):
                    self.loop_file = path
            return data

        def _refuse(self, exc: SpecdeployError):
            self.refused.extend(exc.problems)
            raise AnsibleError(str(exc))

        def check(self) -> None:
            """Raise what was refused while Ansible read (its inventory plugins turn errors into warnings)."""
            if self.refused:
                raise SpecdeployError(list({f.line(): f for f in self.refused}.values()))
            chain = loop_in(self.children)
            if chain:
                raise group_loop(self.loop_file or str(source), chain)

    safe_display()
    loader = Loader()
    return loader, vault_secrets(loader, vault)


def safe_display() -> None:
    """Ansible's own messages printed by this process (its warnings while it reads an inventory quote names and
    file contents) with their control characters escaped (values.terminal), before Ansible colours them."""
    from ansible.utils.display import Display

    from specdeploy.values.terminal import safe
    if getattr(Display.display, "specdeploy_safe", False):
        return
    original = Display.display

    def display(self, msg, *args, **kwargs):
        return original(self, safe(msg, newlines=True) if isinstance(msg, str) else msg, *args, **kwargs)
    display.specdeploy_safe = True
    Display.display = display


def vaulted_vars_file(path: Path, vault: Vault | None) -> tuple[dict[str, Any], set[str]]:
    """A variables file with vaulted content (``-e @file``) as Ansible reads it: (its variables, made plain, and
    the keys whose values came out of the vault: all of them where the whole file is encrypted)."""
    from ansible.errors import AnsibleError
    loader, secrets = guarded_loader(path, vault, groups=False)
    with vault_context(secrets):
        try:
            data = loader.load_from_file(str(path), cache="none")
        except AnsibleError as exc:
            loader.check()
            raise SpecdeployError([Finding("error", "-e", f"{path} cannot be read: {str(exc).splitlines()[0]}",
                                           "give a YAML or JSON file of variables")]) from None
        loader.check()
        if not isinstance(data, dict):
            raise SpecdeployError([Finding("error", "-e", f"{path} is not a mapping",
                                           "give KEY: VALUE lines or a JSON object")])
        locked = undecryptable(data, None)
        if locked:
            raise SpecdeployError(locked)
        whole = read_bytes(path).lstrip().startswith(b"$ANSIBLE_VAULT")
        keys = {str(k) for k, v in data.items() if whole or any(True for _ in encrypted_values(v))}
        return plain(data), keys


def plain(obj: Any) -> Any:
    """Ansible's vars carry its own str/dict subclasses (and lazy templates); make them plain."""
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, float)):
        return obj
    return str(obj)


def encrypted_values(obj: Any) -> Iterator[Any]:
    """The inline vaulted values in a variable's value."""
    from ansible.parsing.vault import EncryptedString
    if isinstance(obj, EncryptedString):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from encrypted_values(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from encrypted_values(v)


def undecryptable(variables: dict[str, Any], host: str | None) -> list[Finding]:
    """A finding for each inline vaulted value of ``variables`` the secrets (of the active vault_context) do not
    open, naming its file and line."""
    from ansible.errors import AnsibleError
    from ansible.parsing.vault import VaultSecretsContext
    ctx = VaultSecretsContext.current(optional=True)
    why = ("none of the vault secrets given decrypts it (a wrong password, or another vault id?)"
           if ctx and ctx.secrets else "no vault secret was given")
    out: list[Finding] = []
    for key, value in variables.items():
        for enc in encrypted_values(value):
            try:
                str(enc)
            except AnsibleError:
                out.append(Finding("error", _origin(enc) or key, f"{key} is vaulted and cannot be decrypted: {why}",
                                   VAULT_FIX, host))
    return out


def _origin(value: Any) -> str | None:
    try:
        from ansible._internal._datatag._tags import Origin
    except ImportError:
        return None
    o = Origin.get_tag(value)
    if o is None or not o.path:
        return None
    return f"{o.path}:{o.line_num}" if o.line_num else str(o.path)
