"""Ansible connection plugin ``specdeploy_fleetsim``: every module call of a simulated fleet host is answered by
``specdeploy.testing.fleethost`` from the host's state (nothing runs, nothing on the controller is touched). Ansible
itself stays real: it templates, runs the filters and the strategy, forks its workers and builds each module's
AnsiballZ payload; this plugin reads the module's name and arguments out of that payload."""
from __future__ import annotations

import ast
import gc
import json
import os
import re

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.plugins.connection import ConnectionBase

from specdeploy.testing.fleetsim import FREEZE_PROBE

DOCUMENTATION = """
    name: specdeploy_fleetsim
    short_description: a simulated specdeploy fleet host (tests and bench only)
    description:
        - Answers module calls from per-host state under the fleet simulator's state directory.
    author: specdeploy
    options:
      host:
        description: the host's address (its ansible_host)
        default: inventory_hostname
        vars:
          - name: inventory_hostname
          - name: ansible_host
      fleetsim_host:
        description: the inventory name whose state answers
        vars:
          - name: inventory_hostname
      fleetsim_state:
        description: the simulated fleet's state directory
        env:
          - name: SPECDEPLOY_FLEETSIM_STATE
        vars:
          - name: specdeploy_fleetsim_state
      pipelining:
        description: module payloads go to the plugin directly
        type: boolean
        default: true
        vars:
          - name: ansible_pipelining
"""

# A controller heap frozen by specdeploy.deploy.forking holds far more objects than this; an interpreter may freeze a
# few hundred of its own at start-up (375 under Python 3.12.3), so "any frozen object" would not tell.
FROZEN_HEAP = 10_000
# The probe runs where a run asks for it (fleetsim.FREEZE_PROBE), as the tests and the bench that read it do:
# gc.get_freeze_count() walks every frozen object (about 10 ms for an Ansible controller's heap), so it is asked once
# per worker and only then.
_frozen_by_pid: dict[int, bool] = {}


def _forked_unfrozen() -> bool:
    pid = os.getpid()  # a worker is one process per host and task; nothing freezes or thaws inside it
    if pid not in _frozen_by_pid:
        _frozen_by_pid[pid] = gc.get_freeze_count() >= FROZEN_HEAP
    return not _frozen_by_pid[pid]

_TMP = re.compile(r"(ansible-tmp-[A-Za-z0-9_.-]+)")
_OS_RELEASE = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\nID=debian\n'


class Connection(ConnectionBase):
    transport = "specdeploy_fleetsim"
    has_pipelining = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._host = None

    def _connect(self):
        if not self._connected:
            from specdeploy.testing.fleethost import FleetHost
            state = self.get_option("fleetsim_state")
            if not state:
                raise AnsibleError("specdeploy_fleetsim: set SPECDEPLOY_FLEETSIM_STATE to the fleet's state directory")
            addr = str(self.get_option("host") or "")
            name = "localhost" if addr in ("localhost", "127.0.0.1", "::1") else str(self.get_option("fleetsim_host"))
            self._host = FleetHost(state, name)
            if name != "localhost" and self._host.fault().get("unreachable"):
                raise AnsibleConnectionFailure(f"Failed to connect to the host via ssh: ssh: connect to host {addr} "
                                               "port 22: Connection timed out")
            self._connected = True
        return self

    def exec_command(self, cmd, in_data=None, sudoable=True):
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        self._connect()
        data = in_data.decode("utf-8", "replace") if isinstance(in_data, bytes) else (in_data or "")
        if "_ansiballz_main(" in data:
            return self._module(data)
        if "osrelease_content" in data:
            return 0, json.dumps({"platform_dist_result": [], "osrelease_content": _OS_RELEASE}).encode(), b""
        if "echo PLATFORM" in cmd:
            return 0, b"PLATFORM\nLinux\nFOUND\n/usr/bin/python3.11\n/usr/bin/python3\nENDFOUND\n", b""
        m = _TMP.search(cmd)
        if m and "mkdir" in cmd:
            return 0, f"{m.group(1)}=/root/.ansible/tmp/{m.group(1)}\n".encode(), b""
        if cmd.strip().startswith("echo ~") or "echo ~" in cmd:
            return 0, b"/root\n", b""
        if "rm -f -r" in cmd:  # Ansible removes its temporary directory: so do the files sent into it
            with self._host.session():
                for k in [k for k in self._host.s["tmp"] if os.path.dirname(k) in cmd]:
                    self._host.s["tmp"].pop(k, None)
            return 0, b"", b""
        if "chmod" in cmd or "setfacl" in cmd:
            return 0, b"", b""
        return 127, b"", f"fleetsim: no simulated answer for the shell line: {cmd[:300]}".encode()

    def _module(self, payload):
        module = params = None
        for line in payload.splitlines():
            if line.startswith("ansible_module="):
                module = ast.literal_eval(line[len("ansible_module="):].rstrip(","))
            elif line.startswith("params="):
                params = ast.literal_eval(line[len("params="):].rstrip(","))
        if module is None or params is None:
            return 1, b"", b"fleetsim: a module payload without its name or parameters"
        args = json.loads(params).get("ANSIBLE_MODULE_ARGS", {})
        args = {k: v for k, v in args.items() if not k.startswith("_ansible_")}
        from specdeploy.testing.fleethost_commands import call
        with self._host.session():
            if os.environ.get(FREEZE_PROBE) == "1" and _forked_unfrozen():
                self._host.s["unfrozen_module_calls"] = self._host.s.get("unfrozen_module_calls", 0) + 1
            result = call(self._host, module, args)
        return 0, json.dumps(result).encode(), b""

    def put_file(self, in_path, out_path):
        super().put_file(in_path, out_path)
        self._connect()
        with open(in_path, "rb") as f:
            raw = f.read(16 << 20)
        with self._host.session():
            self._host.s["tmp"][out_path] = raw.decode("utf-8", "replace")

    def fetch_file(self, in_path, out_path):
        super().fetch_file(in_path, out_path)
        raise AnsibleError(f"specdeploy_fleetsim: fetching {in_path} from a simulated host is not simulated")

    def close(self):
        self._connected = False
