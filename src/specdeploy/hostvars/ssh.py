"""The one ssh command line to a host, from the Ansible variables a play connects with (``ansible_host``,
``ansible_user``, ``ansible_port``, ``ansible_ssh_private_key_file``, ``ansible_ssh_common_args``,
``ansible_ssh_extra_args``). Host facts, the front door's journal reads and the roles' rsync copies all use it."""
from __future__ import annotations

import shlex


def ssh_options(variables, connect_timeout: int = 10) -> list[str]:
    """``ssh`` and its options, without the destination (what ``rsync -e`` takes)."""
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(connect_timeout)}"]
    if variables.get("ansible_port"):
        argv += ["-p", str(variables["ansible_port"])]
    if variables.get("ansible_ssh_private_key_file"):
        argv += ["-i", str(variables["ansible_ssh_private_key_file"])]
    argv += shlex.split(str(variables.get("ansible_ssh_common_args") or ""))
    argv += shlex.split(str(variables.get("ansible_ssh_extra_args") or ""))
    return argv


def destination(host: str, variables) -> str:
    addr = str(variables.get("ansible_host") or host)
    user = variables.get("ansible_user")
    return f"{user}@{addr}" if user else addr


def ssh_argv(host: str, variables, connect_timeout: int = 10) -> list[str]:
    """The ssh command line to ``host``; a remote command goes after it."""
    return ssh_options(variables, connect_timeout) + [destination(host, variables)]
