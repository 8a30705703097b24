"""Sandbox hosts: real Debian bookworm machines booted with systemd-nspawn, for demos, tests and CI.

Each host gets its own network namespace and veth pair, and an overlayfs upper dir on one cached debootstrap
rootfs. The controller reaches them over SSH (paramiko here, OpenSSH for Ansible). Needs root.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from specdeploy.values.hostpaths import SANDBOX_BASE_ARCHIVE

from specdeploy.engines import DEFAULT as DEFAULT_ENGINE
from specdeploy.values.errors import Finding, SpecdeployError
from specdeploy.testing import cache as _cache

CACHE = Path(os.environ.get("SPECDEPLOY_SANDBOX_CACHE", "/var/cache/specdeploy"))


def configured_state() -> Path:
    """The state directory this process was given (SPECDEPLOY_SANDBOX_STATE), whatever STATE was set to since."""
    return Path(os.environ.get("SPECDEPLOY_SANDBOX_STATE", "/var/lib/specdeploy-sandbox"))


STATE = configured_state()
MIRROR = os.environ.get("SPECDEPLOY_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PACKAGES = ["systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv", "python3-pip", "iproute2",
            "ca-certificates", "rsync", "procps", "curl", "prometheus",
            # the production runtime: dockerd, and `requests` for the community.docker modules
            "docker.io", "python3-requests",
            # the real vLLM CPU build, bound in from the controller, loads its kernels with libnuma
            "libnuma1"]
# dockerd inside an nspawn host: all capabilities, the keyring and bpf syscalls, and (see rootfs()) read-write
# cgroup v1 controllers. /var/lib/docker is bound from the controller's disk: overlay2 cannot sit on overlayfs.
NSPAWN_DOCKER = ["--capability=all", "--system-call-filter=@keyring bpf"]
CGROUP_CONTROLLERS = ["cpuset", "cpu", "cpuacct", "blkio", "memory", "devices", "freezer", "pids"]
BASE_IMAGE_IN_HOST = SANDBOX_BASE_ARCHIVE
ROOTFS_LAYOUT = "3"  # bump when the meaning of a package or file changes without its text changing
NSPAWN_RUNTIME = Path("/run/systemd/nspawn")
# machine-wide: one up/down at a time, and which state directory runs each host name
SANDBOX_LOCK = Path("/run/lock/specdeploy-sandbox.lock")
HOSTS_RUN = Path("/run/specdeploy-sandbox")
KEY_COMMENT = "specdeploy-sandbox"
NET_PREFIX = "10.231"


@dataclass
class SandboxHost:
    name: str
    index: int

    @property
    def netns(self) -> str:
        return f"sd-{self.name}"

    @property
    def address(self) -> str:
        return f"{NET_PREFIX}.{self.index}.2"

    @property
    def gateway(self) -> str:
        return f"{NET_PREFIX}.{self.index}.1"

    @property
    def dir(self) -> Path:
        return STATE / "hosts" / self.name

    @property
    def veth_host(self) -> str:
        return f"sdh{self.index}"

    @property
    def veth_peer(self) -> str:
        return f"sdc{self.index}"


def _run(cmd: list[str], check=True, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise SpecdeployError([Finding("error", " ".join(cmd[:3]), (r.stderr or r.stdout).strip()[-400:],
                                       "run as root on a host with systemd-nspawn, iproute2 and overlayfs")])
    return r


def _require_root():
    if os.geteuid() != 0:
        raise SpecdeployError([Finding("error", "sandbox", "needs root (network namespaces, overlayfs, nspawn)",
                                       "run as root, e.g. sudo specdeploy sandbox up")])
    for tool in ("systemd-nspawn", "ip", "debootstrap"):
        if not shutil.which(tool):
            raise SpecdeployError([Finding("error", "sandbox", f"{tool} is not installed",
                                           "bash scripts/setup.sh installs systemd-container, iproute2, debootstrap")])


SUITE = "bookworm"
SSHD_CONFIG = "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n"
CACHE_LOCK = "cache.lock"


def rootfs_key() -> str:
    """What the rootfs is made of: the suite, the packages and the files rootfs() writes into it."""
    return _cache.inputs_key(SUITE, " ".join(PACKAGES), ROOTFS_LAYOUT, SSHD_CONFIG, _prepare_rootfs, cgroup_unit,
                             _write_docker_setup)


def rootfs_path() -> Path:
    return CACHE / f"rootfs-{SUITE}-{rootfs_key()[:16]}"


def _lower_dirs_in_use() -> set[str]:
    """The lower directories of the overlay mounts on this machine (the running hosts' rootfs)."""
    import re
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return set()
    out = set()
    for line in lines:
        pre, sep, post = line.partition(" - ")
        fields = post.split(" ")
        if not sep or len(fields) < 3 or fields[0] != "overlay":
            continue
        for opt in re.split(r"(?<!\\),", fields[2]):
            if opt.startswith(("lowerdir=", "lowerdir+=")):
                for d in re.split(r"(?<!\\):", opt.split("=", 1)[1]):
                    out.add(d.replace("\\", "").encode().decode("unicode_escape"))
    return out


def rootfs(progress=None) -> Path:
    """The cached bookworm rootfs, keyed by its inputs (debootstrap once, ~1-2 minutes; reused while the
    package list and the files written into it stay the same). Built beside its final place and renamed in;
    a failed debootstrap unmounts what it mounted and leaves nothing behind."""
    final = rootfs_path()

    def build(tmp: Path):
        if progress:
            progress(f"debootstrap {SUITE} into {final.name} (cached by content)")
        _run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(tmp), MIRROR],
             timeout=1200)
        _prepare_rootfs(tmp)

    root = _cache.build_entry(final, rootfs_key(), build, CACHE / CACHE_LOCK, "sandbox rootfs build", progress)
    with _cache.locked(CACHE / CACHE_LOCK, "sandbox rootfs build", progress):
        lowers = _lower_dirs_in_use()
        _cache.prune(CACHE, f"rootfs-{SUITE}*", keep=root,
                     in_use=lambda p: any(x == str(p) or x.startswith(f"{p}/") for x in lowers))
    return root


def _prepare_rootfs(tmp: Path):
    # sshd: keys only; no first-boot wait for network
    (tmp / "etc/ssh/sshd_config.d/specdeploy.conf").write_text(SSHD_CONFIG)
    wait_online = tmp / "etc/systemd/system/systemd-networkd-wait-online.service"
    wait_online.unlink(missing_ok=True)
    wait_online.symlink_to("/dev/null")
    _write_docker_setup(tmp)


def cgroup_unit() -> str:
    """Sandbox-only oneshot before docker.service: nspawn mounts the cgroup v1 controllers read-only, and
    containers then fail on /sys/fs/cgroup/<controller>/docker/...; re-mount each one read-write."""
    cmds = "; ".join(f"umount -l /sys/fs/cgroup/{c}; mount -t cgroup -o {c} cgroup /sys/fs/cgroup/{c}"
                     for c in CGROUP_CONTROLLERS)
    return ("[Unit]\nDescription=specdeploy sandbox: cgroup v1 controllers read-write for dockerd\n"
            "DefaultDependencies=no\nBefore=docker.service containerd.service\nAfter=local-fs.target\n"
            "ConditionPathIsDirectory=/sys/fs/cgroup/cpuset\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\n"
            f"ExecStart=/bin/sh -c '{cmds}'\n\n[Install]\nWantedBy=multi-user.target docker.service\n")


def _write_docker_setup(root: Path):
    units = root / "etc/systemd/system"
    (units / "specdeploy-sandbox-cgroups.service").write_text(cgroup_unit())
    for target in ("multi-user.target.wants", "docker.service.wants"):
        (units / target).mkdir(parents=True, exist_ok=True)
        link = units / target / "specdeploy-sandbox-cgroups.service"
        link.unlink(missing_ok=True)
        link.symlink_to("/etc/systemd/system/specdeploy-sandbox-cgroups.service")
    wants = units / "multi-user.target.wants"
    for unit in ("docker.service", "containerd.service"):
        if not (wants / unit).is_symlink() and (root / "lib/systemd/system" / unit).is_file():
            (wants / unit).symlink_to(f"/lib/systemd/system/{unit}")
    (root / "etc/docker").mkdir(parents=True, exist_ok=True)
    (root / "etc/docker/daemon.json").write_text(json.dumps({"storage-driver": "overlay2"}) + "\n")


IMAGE_LAYOUT = "3"  # bump when base_image() writes a different archive


def base_image_tag(root: Path) -> str:
    """The base image's tag, from the rootfs's key (which names everything in it) and the archive layout."""
    key = _cache.key_of(root) or rootfs_key()
    return "specdeploy-sandbox/base:" + _cache.inputs_key(key, IMAGE_LAYOUT)[:12]


def base_image(root: Path, progress=None) -> Path:
    """The cached rootfs as a ``docker save`` archive (one layer), loaded on the hosts by the engine_image role:
    the base the sandbox engine images are built FROM, since Docker Hub is out of reach. Keyed by its tag."""
    import hashlib
    tag = base_image_tag(root)
    final = CACHE / f"base-image-{tag.rsplit(':', 1)[1]}"

    def build(work: Path):
        if progress:
            progress(f"base image {tag} from the rootfs")
        (work / "layer").mkdir(parents=True)
        layer = work / "layer" / "layer.tar"
        _run(["tar", "-C", str(root), "--numeric-owner", "--exclude=./proc/*", "--exclude=./sys/*",
              "--exclude=./dev/*", "--exclude=./run/*", "--exclude=./var/lib/docker/*",
              "--exclude=./var/cache/apt/archives/*.deb", f"--exclude=./{_cache.KEY_FILE}", "-cf", str(layer), "."],
             timeout=600)
        h = hashlib.sha256()
        with open(layer, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        config = json.dumps({"architecture": "amd64", "os": "linux",
                             "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                                        "Cmd": ["/bin/bash"]},
                             "rootfs": {"type": "layers", "diff_ids": [f"sha256:{h.hexdigest()}"]},
                             "history": [{"created_by": "specdeploy sandbox: debootstrap rootfs"}]}).encode()
        cfg_name = hashlib.sha256(config).hexdigest() + ".json"
        (work / cfg_name).write_bytes(config)
        (work / "manifest.json").write_text(json.dumps([{"Config": cfg_name, "RepoTags": [tag],
                                                          "Layers": ["layer/layer.tar"]}]))
        _run(["tar", "-C", str(work), "-cf", str(work / "base-image.tar"), "manifest.json", cfg_name, "layer"],
             timeout=600)
        _cache.remove_tree(work / "layer")
        (work / cfg_name).unlink()
        (work / "manifest.json").unlink()

    d = _cache.build_entry(final, tag, build, CACHE / CACHE_LOCK, "sandbox base image build", progress)
    with _cache.locked(CACHE / CACHE_LOCK, "sandbox base image build", progress):
        # a running host keeps the archive it was booted with: nspawn bound that file (its inode) into it
        _cache.prune(CACHE, "base-image*", keep=d)
    return d / "base-image.tar"


def keypair() -> tuple[Path, str]:
    import paramiko
    key_path = STATE / "id_ed25519"
    if not key_path.is_file():
        STATE.mkdir(parents=True, exist_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", KEY_COMMENT, "-f", str(key_path)])
    pub = (STATE / "id_ed25519.pub").read_text().strip()
    paramiko.Ed25519Key.from_private_key_file(str(key_path))  # fails early on a corrupt key
    return key_path, pub


def _ensure_nspawn_runtime():
    NSPAWN_RUNTIME.mkdir(parents=True, exist_ok=True)
    if _run(["mountpoint", "-q", str(NSPAWN_RUNTIME)], check=False).returncode != 0:
        _run(["mount", "-t", "tmpfs", "tmpfs", str(NSPAWN_RUNTIME)])


def _pid(h: SandboxHost) -> int | None:
    """The host's nspawn process, if it runs: the recorded pid must still be systemd-nspawn booting this host's
    directory (after a reboot the number may belong to anything else)."""
    f = h.dir / "nspawn.pid"
    try:
        pid = int(f.read_text())
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    if not cmd or not cmd[0].endswith(b"systemd-nspawn") or str(h.dir / "merged").encode() not in cmd:
        return None
    return pid


def _net_up(h: SandboxHost):
    if _run(["ip", "netns", "list"]).stdout.split().count(h.netns) == 0:
        _run(["ip", "netns", "add", h.netns])
    if _run(["ip", "link", "show", h.veth_host], check=False).returncode != 0:
        _run(["ip", "link", "add", h.veth_host, "type", "veth", "peer", "name", h.veth_peer])
        _run(["ip", "link", "set", h.veth_peer, "netns", h.netns])
        _run(["ip", "addr", "add", f"{h.gateway}/24", "dev", h.veth_host])
        _run(["ip", "-n", h.netns, "addr", "add", f"{h.address}/24", "dev", h.veth_peer])
    _run(["ip", "link", "set", h.veth_host, "up"])
    _run(["ip", "-n", h.netns, "link", "set", h.veth_peer, "up"])
    _run(["ip", "-n", h.netns, "link", "set", "lo", "up"])
    _run(["ip", "-n", h.netns, "route", "replace", "default", "via", h.gateway])


def _overlay(h: SandboxHost, lower: Path) -> Path:
    merged = h.dir / "merged"
    for d in ("upper", "work", "merged"):
        (h.dir / d).mkdir(parents=True, exist_ok=True)
    if _run(["mountpoint", "-q", str(merged)], check=False).returncode != 0:
        _run(["mount", "-t", "overlay", "overlay", "-o",
              f"lowerdir={lower},upperdir={h.dir / 'upper'},workdir={h.dir / 'work'}", str(merged)])
    return merged


def _wait_ssh(h: SandboxHost, key: Path, timeout: float = 90):
    import paramiko
    t0 = time.time()
    last = None
    while time.time() - t0 < timeout:
        c = paramiko.SSHClient()
        c.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        try:
            c.connect(h.address, username="root", key_filename=str(key), timeout=3, banner_timeout=5,
                      auth_timeout=5, allow_agent=False, look_for_keys=False)
            _, out, _ = c.exec_command("systemctl is-system-running --wait", timeout=60)
            state = out.read().decode().strip()
            if state in ("running", "degraded"):
                return state
            last = state
        except Exception as exc:  # noqa: BLE001 - sshd is still starting
            last = exc
        finally:
            c.close()
        time.sleep(1)
    raise SpecdeployError([Finding("error", h.name, f"no SSH within {timeout:.0f} s ({last})",
                                   f"see {h.dir / 'console.log'}")])


def hosts_from_state() -> list[SandboxHost]:
    f = STATE / "hosts.json"
    if not f.is_file():
        return []
    return [SandboxHost(**d) for d in json.loads(f.read_text())]


def _owner_file(h: SandboxHost) -> Path:
    return HOSTS_RUN / f"{h.name}.json"


def _check_owner(h: SandboxHost):
    """Host names, network namespaces and veths are machine-wide: a host that another state directory runs is
    refused, never taken over."""
    f = _owner_file(h)
    try:
        owner = json.loads(f.read_text()) if f.is_file() else None
    except (OSError, ValueError):
        owner = None
    if not isinstance(owner, dict) or owner.get("state") == str(STATE):
        return
    pid = owner.get("pid")
    alive = isinstance(pid, int) and pid > 0 and Path(f"/proc/{pid}").exists()
    if alive:
        raise SpecdeployError([Finding(
            "error", h.name, f"already up, from the sandbox state {owner.get('state')} (nspawn pid {pid})",
            f"stop it first: SPECDEPLOY_SANDBOX_STATE={owner.get('state')} specdeploy sandbox down")])


def real_engine_binds(version: str, progress=None) -> list[str]:
    """What a sandbox host needs from the controller to run the real vLLM ``version`` (the CPU build): its venv
    (built once, content-keyed) and the interpreter it was made from, both read-only at their own paths, so the
    venv's scripts and its pyvenv.cfg resolve inside the host as they do here. No package mirror is involved."""
    from specdeploy.testing import realengine
    venv = realengine.venv(version, progress)
    home = next((ln.split("=", 1)[1].strip() for ln in (venv / "pyvenv.cfg").read_text().splitlines()
                 if ln.split("=", 1)[0].strip() == "home"), None)
    if not home:
        raise SpecdeployError([Finding("error", str(venv / "pyvenv.cfg"), "no home = line: not a venv",
                                       "remove the venv and build it again (python -m specdeploy.testing."
                                       "realengine build " + version + ")")])
    prefix = Path(home).resolve().parent
    return [str(venv), str(prefix)]


def up(n: int = 2, progress=None, real_engine: str | None = None, first: int = 1) -> list[SandboxHost]:
    """Boot N hosts (or keep those already running), ``sdhost<first>`` onwards. One ``up`` or ``down`` at a time
    on this machine: a second one waits for the first (a lock), then finds its hosts running. ``real_engine``: a
    vLLM version whose CPU build the hosts can run (its venv and interpreter bound read-only into each host).
    Two state directories may run at once with hosts of different numbers (the tests' two fleets)."""
    _require_root()
    if not 1 <= first <= 250 - n:
        raise SpecdeployError([Finding("error", "first", f"host numbers {first}..{first + n - 1} are out of range",
                                       "number the hosts from 1 to 249")])
    binds = real_engine_binds(real_engine, progress) if real_engine else []
    with _cache.locked(SANDBOX_LOCK, "sandbox up/down", progress):
        return _up(n, progress, binds, first)


def _up(n: int, progress=None, binds: list[str] | None = None, first: int = 1) -> list[SandboxHost]:
    binds = list(binds or [])
    lower = rootfs(progress)
    base = base_image(lower, progress)
    key, pub = keypair()
    _ensure_nspawn_runtime()
    _run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
    hosts = [SandboxHost(f"sdhost{i}", i) for i in range(first, first + n)]
    for h in hosts:
        if progress:
            progress(f"boot {h.name} ({h.address})")
        _check_owner(h)
        _net_up(h)
        if _pid(h):
            had = json.loads((h.dir / "binds.json").read_text()) if (h.dir / "binds.json").is_file() else []
            if not set(binds) <= set(had):
                raise SpecdeployError([Finding("error", h.name, "runs without the real engine's venv bound in",
                                               "specdeploy sandbox down, then up again with the real engine")])
            continue
        merged = _overlay(h, lower)
        (merged / "etc/hostname").write_text(h.name + "\n")
        ssh_dir = merged / "root/.ssh"
        ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        (ssh_dir / "authorized_keys").write_text(pub + "\n")
        os.chmod(ssh_dir / "authorized_keys", 0o600)
        # No resolver: a name outside the sandbox fails at once, as on a closed network with its own DNS, instead
        # of each lookup waiting out the controller's resolver, which the host cannot reach (20 s each).
        resolv = merged / "etc/resolv.conf"
        resolv.unlink(missing_ok=True)
        resolv.write_text("# specdeploy sandbox host: no resolver; names outside the sandbox fail at once\n"
                          "nameserver 127.0.0.1\n")
        (merged / "etc/hosts").write_text("127.0.0.1 localhost\n" + "".join(
            f"{x.address} {x.name}\n" for x in hosts))
        docker_dir = h.dir / "docker"  # on the controller's disk (ext4), for overlay2
        docker_dir.mkdir(exist_ok=True)
        for b in binds:
            # the engine's service user reaches an interpreter under /root only if it may pass through /root
            if b.startswith("/root/"):
                os.chmod(merged / "root", 0o711)
        (h.dir / "binds.json").write_text(json.dumps(binds))
        log = open(h.dir / "console.log", "ab")
        p = subprocess.Popen(["systemd-nspawn", "--register=no", "--keep-unit", "-q", "-b", "-D", str(merged),
                              f"--network-namespace-path=/run/netns/{h.netns}", f"--machine={h.name}",
                              f"--hostname={h.name}", "--resolv-conf=off", *NSPAWN_DOCKER,
                              f"--bind={docker_dir}:/var/lib/docker",
                              f"--bind-ro={base}:{BASE_IMAGE_IN_HOST}", *(f"--bind-ro={b}" for b in binds)],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        (h.dir / "nspawn.pid").write_text(str(p.pid))
        HOSTS_RUN.mkdir(parents=True, exist_ok=True)
        _owner_file(h).write_text(json.dumps({"state": str(STATE), "pid": p.pid}))
    existing = {x.name: x for x in hosts_from_state()}
    existing.update({h.name: h for h in hosts})
    STATE.mkdir(parents=True, exist_ok=True)
    (STATE / "hosts.json").write_text(json.dumps([{"name": h.name, "index": h.index} for h in existing.values()]))
    for h in hosts:
        if progress:
            progress(f"wait for SSH on {h.name}")
        _wait_ssh(h, key)
    return hosts


def stop_host(h: SandboxHost, timeout: float = 30):
    pid = _pid(h)
    if pid:
        os.kill(pid, signal.SIGTERM)  # nspawn asks the container's systemd to power off
        t0 = time.time()
        while time.time() - t0 < timeout and _pid(h):
            time.sleep(0.3)
        if _pid(h):
            os.killpg(pid, signal.SIGKILL)
    (h.dir / "nspawn.pid").unlink(missing_ok=True)


def _owned_elsewhere(h: SandboxHost) -> str | None:
    """The other state directory that runs a host of this name now, if any."""
    try:
        _check_owner(h)
    except SpecdeployError:
        return json.loads(_owner_file(h).read_text()).get("state")
    return None


def down(progress=None):
    """Stop every host of this state directory and remove what the sandbox made in it: overlays, networks, host
    directories, its key pair and its artifacts. A host name another state directory runs now is left alone (the
    names are machine-wide), and nothing the sandbox did not write is removed. The content-keyed caches (rootfs,
    base image) stay."""
    _require_root()
    with _cache.locked(SANDBOX_LOCK, "sandbox up/down", progress):
        for h in hosts_from_state():
            other = _owned_elsewhere(h)
            if other:
                if progress:
                    progress(f"{h.name} runs from the sandbox state {other}: left alone")
                continue
            if progress:
                progress(f"stop {h.name}")
            stop_host(h)
            merged = h.dir / "merged"
            if _run(["mountpoint", "-q", str(merged)], check=False).returncode == 0:
                _run(["umount", str(merged)], check=False)
            _run(["ip", "link", "del", h.veth_host], check=False)
            _run(["ip", "netns", "del", h.netns], check=False)
            _cache.remove_tree(h.dir)
            _owner_file(h).unlink(missing_ok=True)
        (STATE / "hosts.json").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            (STATE / "hosts").rmdir()  # only when empty: the hosts above were ours
        pub = STATE / "id_ed25519.pub"
        if pub.is_file() and pub.read_text(errors="replace").strip().endswith(KEY_COMMENT):
            for name in ("id_ed25519", "id_ed25519.pub"):
                (STATE / name).unlink(missing_ok=True)
        if _cache.key_of(STATE / "artifacts"):  # written by artifacts(): it carries its key
            _cache.remove_tree(STATE / "artifacts")
        (STATE / "artifacts.lock").unlink(missing_ok=True)
        for left in STATE.glob(".artifacts.*"):
            _cache.remove_tree(left)


# The inventory and checkpoints of the sandbox (testing/sandbox_inventory.py), with this module's state.
from specdeploy.testing import sandbox_inventory as _inventory  # noqa: E402
from specdeploy.testing.sandbox_inventory import ARTIFACT_DRAFTER, ARTIFACT_MODEL, real_engine_vars  # noqa: E402,F401

_example_model = _inventory.example_model
_build_artifacts = _inventory.build_artifacts


def write_inventory(hosts: list[SandboxHost], dest: Path, engine: str = DEFAULT_ENGINE, runtime: str = "docker",
                    real_engine: str | None = None, target: str = "deepseek_v3") -> Path:
    """inventory/sandbox for ``hosts`` (sandbox_inventory.write_inventory), with this sandbox's key, checkpoints and
    base image."""
    key, _ = keypair()
    base = base_image_tag(rootfs_path()) if runtime == "docker" and not real_engine else None
    return _inventory.write_inventory(hosts, dest, key, STATE / "artifacts", base, engine, runtime, real_engine,
                                      target)


def artifacts_key() -> str:
    """What the sandbox checkpoints are made of: the fixture code and the example model's non-weight files."""
    return _inventory.artifacts_key()


def artifacts(progress=None) -> Path:
    """The sandbox's model and drafter, under STATE/artifacts, keyed by their inputs: a set written by other
    code or from other example files is rebuilt (beside, then renamed in), never reused. Returns the drafter."""
    root = _cache.build_entry(STATE / "artifacts", artifacts_key(), _inventory.build_artifacts,
                              STATE / "artifacts.lock", "sandbox artifact build", progress)
    return root / ARTIFACT_DRAFTER
