"""What a GPU host is, read from its own tools, and what follows from it.

Parsers for ``nvidia-smi`` (table, ``-q`` and ``--query-gpu`` CSV), ``nvidia-smi topo -m`` (through
``nccl.topo``), ``lspci -vvv`` ACS control lines (through ``nccl.topo.parse_acs``), the fabric manager's
status and journal, ``/proc/cmdline`` and ``/proc/driver/nvidia/version``; the driver/CUDA/compute-capability
decision for the chosen engine version; the packages a bare host needs; and one report per host
(``specdeploy preflight --hosts``, the ``gpu_host`` role). Nothing here changes a host.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
from dataclasses import asdict, dataclass, field

from specdeploy.values.errors import Report
from specdeploy.values.hardware import HardwareProfile
from specdeploy.nccl.topo import Topology, iommu_mode, parse_acs, parse_topo_matrix

# --------------------------------------------------------------------------------------------------------------
# versions

Version = tuple[int, ...]


def version(text: str | None) -> Version | None:
    m = re.match(r"\s*(\d+(?:\.\d+)*)", text or "")
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def _mm(v: Version | None) -> Version | None:
    return None if v is None else (v + (0,))[:2]


def _fmt(v: Version | None) -> str:
    return ".".join(map(str, v)) if v else "unknown"


# The CUDA version (major.minor) each Linux driver branch supports natively: the "CUDA Version" nvidia-smi prints
# for that branch (CUDA toolkit release notes, table "CUDA Toolkit and corresponding driver versions").
BRANCH_CUDA: dict[int, Version] = {
    525: (12, 0), 530: (12, 1), 535: (12, 2), 545: (12, 3), 550: (12, 4), 555: (12, 5), 560: (12, 6),
    565: (12, 7), 570: (12, 8), 575: (12, 9), 580: (13, 0),
}

# The first CUDA release that compiles for each SM generation (Blackwell SM100/SM120: CUDA 12.8).
SM_MIN_CUDA: dict[int, Version] = {80: (11, 0), 89: (11, 8), 90: (11, 8), 100: (12, 8), 103: (12, 9),
                                   120: (12, 8)}

def image_cuda(engine: str, engine_version: str) -> tuple[Version | None, Version | None]:
    """(lowest, highest) major.minor CUDA the engine version's official image may need; (None, None) if unknown."""
    # recorded per engine in its adapter (``image_cuda``), read from the release's Dockerfile (ARG CUDA_VERSION=).
    # Versions between two recorded points are resolved only when both points agree on major.minor; otherwise
    # the answer is a range.
    from specdeploy.engines import get
    points = sorted((version(k), _mm(version(v))) for k, v in get(engine).image_cuda.items())
    want = version(engine_version)
    if want is None or not points:
        return None, None
    for v, cuda in points:
        if v == want:
            return cuda, cuda
    below = [c for v, c in points if v < want]
    above = [c for v, c in points if v > want]
    if below and above:
        return below[-1], above[0]
    return None, None


def driver_cuda(driver: str | None, reported: str | None = None) -> Version | None:
    """The CUDA version a driver supports: what nvidia-smi reports, else the branch table."""
    if reported and version(reported):
        return _mm(version(reported))
    v = version(driver)
    return BRANCH_CUDA.get(v[0]) if v else None


# --------------------------------------------------------------------------------------------------------------
# nvidia-smi

@dataclass
class Gpu:
    index: int | None = None
    name: str = ""
    bus_id: str | None = None
    memory_mib: int | None = None
    persistence: bool | None = None
    compute_cap: str | None = None
    fabric_state: str | None = None
    fabric_status: str | None = None


@dataclass
class Smi:
    driver: str | None = None
    cuda: str | None = None  # None: not reported ("Not Found" or CSV output)
    gpus: list[Gpu] = field(default_factory=list)
    attached: int | None = None  # "Attached GPUs" from -q, when present

    @property
    def count(self) -> int:
        return self.attached if self.attached is not None else len(self.gpus)

    def to_dict(self) -> dict:
        return asdict(self) | {"count": self.count}


SMI_FIELDS = ("index", "name", "pci.bus_id", "driver_version", "memory.total", "persistence_mode", "compute_cap")
SMI_QUERY = f"nvidia-smi --query-gpu={','.join(SMI_FIELDS)} --format=csv,noheader,nounits"


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_smi(text: str) -> Smi:
    """Any of: the default table, ``nvidia-smi -q``, or ``--query-gpu`` CSV (with or without header)."""
    text = ANSI.sub("", text)
    if "NVSMI LOG" in text or re.search(r"^\s*Attached GPUs\s*:", text, re.M):
        return _parse_smi_q(text)
    if re.search(r"(Driver|KMD) Version:", text) or re.search(r"^\|\s+\d+\s+\S", text, re.M):
        return _parse_smi_table(text)
    return _parse_smi_csv(text)


def _parse_smi_table(text: str) -> Smi:
    smi = Smi()
    m = re.search(r"(?:Driver|KMD) Version:\s*([\d.]+)", text)
    smi.driver = m.group(1) if m else None
    m = re.search(r"CUDA (?:UMD )?Version:\s*([\d.]+)", text)
    smi.cuda = m.group(1) if m else None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^\|\s+(\d+)\s+(.+?)\s+(On|Off)\s*\|\s*"
                     r"([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)", line)
        if not m:
            continue
        gpu = Gpu(index=int(m.group(1)), name=m.group(2).strip(), persistence=m.group(3) == "On",
                  bus_id=m.group(4))
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        mm = re.search(r"(\d+)MiB\s*/\s*(\d+)MiB", nxt)
        gpu.memory_mib = int(mm.group(2)) if mm else None
        smi.gpus.append(gpu)
    return smi


def _parse_smi_q(text: str) -> Smi:
    smi = Smi()
    cur: Gpu | None = None
    section = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        m = re.match(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$", line)
        if m:
            cur = Gpu(index=len(smi.gpus), bus_id=m.group(1))
            smi.gpus.append(cur)
            section = ""
            continue
        kv = re.match(r"^(\s*)([^:]+?)\s*:\s*(.*)$", line)
        if not kv:
            if line.strip():
                section = line.strip()
            continue
        indent, key, val = len(kv.group(1)), kv.group(2).strip(), kv.group(3).strip()
        if cur is None:
            if key == "Driver Version":
                smi.driver = val
            elif key == "CUDA Version":
                smi.cuda = val if version(val) else None
            elif key == "Attached GPUs" and val.isdigit():
                smi.attached = int(val)
            continue
        if indent <= 4:
            section = ""
        if key == "Product Name":
            cur.name = val
        elif key == "Persistence Mode":
            cur.persistence = val == "Enabled"
        elif key == "Minor Number" and val.isdigit() and cur.index is None:
            cur.index = int(val)
        elif section == "FB Memory Usage" and key == "Total":
            cur.memory_mib = int(version(val)[0]) if version(val) else None
        elif section == "Fabric" and key == "State":
            cur.fabric_state = val
        elif section == "Fabric" and key == "Status":
            cur.fabric_status = val
    return smi


def _parse_smi_csv(text: str) -> Smi:
    smi = Smi()
    fields = list(SMI_FIELDS)
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if not line.strip() or len(cells) < 3:
            continue
        if cells[0] == "index" or cells[0].startswith("index"):
            fields = [re.sub(r"\s*\[.*\]$", "", c) for c in cells]
            continue
        row = dict(zip(fields, cells))
        if not row.get("index", "").isdigit():
            continue
        mem = version(row.get("memory.total"))
        smi.gpus.append(Gpu(index=int(row["index"]), name=row.get("name", ""), bus_id=row.get("pci.bus_id"),
                            memory_mib=mem[0] if mem else None,
                            persistence={"Enabled": True, "Disabled": False}.get(row.get("persistence_mode", "")),
                            compute_cap=row.get("compute_cap") if version(row.get("compute_cap")) else None))
        smi.driver = smi.driver or row.get("driver_version")
    return smi


# --------------------------------------------------------------------------------------------------------------
# topology, ACS, IOMMU, kernel module

def parse_topo(text: str) -> Topology:
    """``nvidia-smi topo -m``; also a matrix pasted without its header row: GPU columns come first, so row GPUk
    names its links to GPU0..GPU(n-1) for the n rows present."""
    first = next((ln.split() for ln in text.splitlines() if re.match(r"^\s*GPU0\b", ln)), None)
    if first and first[1:2] != ["X"]:
        return parse_topo_matrix(text)
    rows = [line.split() for line in text.splitlines() if re.match(r"^\s*GPU\d+\s", line)]
    if not rows:
        raise ValueError("not an `nvidia-smi topo -m` matrix: no GPU rows")
    names = [r[0] for r in rows]
    topo = Topology(gpus=names)
    for r in rows:
        for col, val in zip(names, r[1:]):
            if col != r[0]:
                topo.links[(r[0], col)] = val
    return topo


def nvlink_gaps(topo: Topology) -> dict[str, list[str]]:
    """GPU -> the GPUs it reaches without NVLink (only pairs the matrix shows)."""
    out: dict[str, list[str]] = {}
    for (a, b), v in topo.links.items():
        if not v.startswith("NV"):
            out.setdefault(a, []).append(b)
    return out


@dataclass
class Acs:
    redirect: list[str]  # bridges (address, or "ACSCtl line N" when lspci output carries no addresses)
    checked: int

    @property
    def known(self) -> bool:
        return self.checked > 0


def parse_acs_state(lspci_vvv: str) -> Acs:
    by_dev = parse_acs(lspci_vvv)
    if by_dev:
        return Acs([d for d, on in by_dev.items() if on], len(by_dev))
    lines = [ln for ln in lspci_vvv.splitlines() if "ACSCtl:" in ln]
    return Acs([f"ACSCtl line {i + 1}" for i, ln in enumerate(lines) if re.search(r"ReqRedir\+|CmpltRedir\+", ln)],
               len(lines))


def iommu_state(cmdline: str, iommu_groups: int | None = None) -> str:
    """'off', 'passthrough', 'translated' or 'unknown'. An explicit intel_iommu=on/amd_iommu=on without
    passthrough translates DMA; without either, the mode depends on the kernel's default and the groups count."""
    mode = iommu_mode(cmdline, iommu_groups)
    if mode == "unknown" and re.search(r"\b(intel_iommu|amd_iommu)=on\b", cmdline):
        return "translated"
    return mode


def open_kernel_module(nvrm_version: str) -> bool | None:
    """From /proc/driver/nvidia/version: True for the open kernel modules, None when the file is absent."""
    if "NVRM version" not in nvrm_version:
        return None
    return "Open Kernel Module" in nvrm_version


def nvrm_driver(nvrm_version: str) -> str | None:
    m = re.search(r"NVRM version:.*?\s(\d{3}\.\d+(?:\.\d+)?)\s", nvrm_version)
    return m.group(1) if m else None


# --------------------------------------------------------------------------------------------------------------
# fabric manager

@dataclass
class FabricManager:
    state: str  # running | failed | stopped | absent | unknown
    fm_version: str | None = None
    driver_version: str | None = None  # what the fabric manager says the driver is (mismatch message)
    no_nvswitch: bool = False  # NV_WARN_NOTHING_TO_DO: no NVSwitch found, or NVLSM not running on NVLink 5
    nvlsm: bool = False  # the log shows NVLSM started
    notes: list[str] = field(default_factory=list)

    @property
    def mismatch(self) -> bool:
        return bool(self.fm_version and self.driver_version and self.fm_version != self.driver_version)


def parse_fabricmanager(text: str) -> FabricManager:
    """``systemctl status``/``show`` and journal lines of nvidia-fabricmanager; the last event decides the state."""
    fm = FabricManager("unknown")
    m = re.search(r"driver interface version\s+(\d+(?:\.\d+)+)\s+(?:don't|doesn't|do not) match with driver "
                  r"version\s+(\d+(?:\.\d+)+)", text)
    if m:
        fm.fm_version, fm.driver_version = m.group(1), m.group(2)
        fm.notes.append(f"fabric manager {m.group(1)} does not match driver {m.group(2)}")
    if "NV_WARN_NOTHING_TO_DO" in text:
        fm.no_nvswitch = True
    if re.search(r"nvlsm|NVLink Subnet Manager", text, re.I) and re.search(r"running command: \S*nvlsm|OpenSM",
                                                                            text):
        fm.nvlsm = True
    events = []
    for line in text.splitlines():
        if re.search(r"Active: active \(running\)|ActiveState=active|^active$|Started .*[Ff]abric [Mm]anager"
                     r"|Successfully configured all the available NVSwitches", line):
            events.append("running")
        elif re.search(r"Active: failed|ActiveState=failed|^failed$|status=1/FAILURE|Job for nvidia-fabricmanager"
                       r"\S* failed|failed! Exit code|Failed to start", line):
            events.append("failed")
        elif re.search(r"Active: inactive|ActiveState=inactive|^inactive$|Stopped .*[Ff]abric [Mm]anager", line):
            events.append("stopped")
        elif re.search(r"LoadState=not-found|Unit nvidia-fabricmanager\S* could not be found", line):
            events.append("absent")
    # "Job ... failed" is printed before the journal it points to; a failure anywhere outranks an earlier start
    if "failed" in events and events[-1] != "running":
        fm.state = "failed"
    elif events:
        fm.state = events[-1]
    elif fm.mismatch or fm.no_nvswitch:
        fm.state = "failed"
    return fm


# --------------------------------------------------------------------------------------------------------------
# what a bare host needs

CUDA_REPO = "https://developer.download.nvidia.com/compute/cuda/repos"
SUPPORTED_OS = {("ubuntu", "22.04"): "ubuntu2204", ("ubuntu", "24.04"): "ubuntu2404", ("debian", "12"): "debian12"}
DOCKER_REPO = "https://download.docker.com/linux"
TOOLKIT_REPO = "https://nvidia.github.io/libnvidia-container"


def cuda_repo_path(os_id: str, os_version: str) -> str | None:
    return SUPPORTED_OS.get((os_id.lower(), os_version))


def install_plan(profile: HardwareProfile, os_id: str, os_version: str, codename: str, arch: str = "x86_64",
                 driver_version: str | None = None) -> dict:
    """Repositories and packages for a bare host of this profile. ``driver_version`` (the installed one) pins
    the fabric manager to exactly that version."""
    repo = cuda_repo_path(os_id, os_version)
    deb_arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(arch, arch)
    cuda_arch = {"amd64": "x86_64", "arm64": "sbsa"}.get(deb_arch, arch)
    branch = profile.driver_branch
    plan: dict = {
        "supported": repo is not None,
        "cuda_repo": f"{CUDA_REPO}/{repo}/{cuda_arch}/" if repo else None,
        "cuda_keyring": f"{CUDA_REPO}/{repo}/{cuda_arch}/cuda-keyring_1.1-1_all.deb" if repo else None,
        "driver_branch": branch,
        # nvidia-driver-pinning-<branch> holds apt to the branch; nvidia-open is the open-kernel-module driver,
        # cuda-drivers the proprietary one.
        "driver_packages": [f"nvidia-driver-pinning-{branch}", "nvidia-open" if profile.open_modules else
                            "cuda-drivers"],
        "open_modules": profile.open_modules,
        "fabric_manager": profile.fabric_manager,
        "fabric_manager_packages": [],
        "nvlsm": profile.nvlsm,
        "docker_repo": f"{DOCKER_REPO}/{os_id.lower()}",
        "docker_key": f"{DOCKER_REPO}/{os_id.lower()}/gpg",
        "docker_suite": codename,
        "docker_packages": ["docker-ce", "docker-ce-cli", "containerd.io"],
        "toolkit_repo": f"{TOOLKIT_REPO}/stable/deb/{deb_arch}",
        "toolkit_key": f"{TOOLKIT_REPO}/gpgkey",
        "toolkit_packages": ["nvidia-container-toolkit"],
    }
    if profile.fabric_manager:
        v = version(driver_version)
        if v and v[0] >= 580:
            fm = [f"nvidia-fabricmanager={driver_version}-*"]
        elif v:
            fm = [f"nvidia-fabricmanager-{v[0]}={driver_version}-*"]
        else:
            fm = []
        plan["fabric_manager_packages"] = fm + (["nvlsm"] if profile.nvlsm else [])
    return plan


NVIDIA_RUNTIME = {"path": "nvidia-container-runtime", "args": []}
DEFAULT_ULIMITS = {"memlock": {"Name": "memlock", "Hard": -1, "Soft": -1},
                   "nofile": {"Name": "nofile", "Hard": 1048576, "Soft": 1048576}}


def docker_daemon_config(current: str | None, gpus: bool = True) -> dict:
    """daemon.json with the NVIDIA runtime and the engine's ulimits (memlock, nofile) merged in; every other key
    of the current file is kept. ``differs`` is False when the file already says this, in any formatting.
    The ulimits are for hosts with GPUs only: where the daemon's own hard limits are lower (a sandbox host
    inherits its controller's), every container, image builds included, would fail to start with them."""
    try:
        cur = json.loads(current) if current and current.strip() else {}
    except json.JSONDecodeError as exc:
        return {"differs": False, "error": f"/etc/docker/daemon.json is not JSON ({exc.msg} at line {exc.lineno})",
                "content": current}
    if not isinstance(cur, dict):
        return {"differs": False, "error": "/etc/docker/daemon.json is not a JSON object", "content": current}
    new = json.loads(json.dumps(cur))
    new.setdefault("runtimes", {})["nvidia"] = dict(NVIDIA_RUNTIME)
    if gpus:
        ul = new.setdefault("default-ulimits", {})
        for k, v in DEFAULT_ULIMITS.items():
            ul.setdefault(k, v)
    return {"differs": new != cur, "content": json.dumps(new, indent=2, sort_keys=True) + "\n", "error": None}


# setpci clears ReqRedir (bit 2) and CmpltRedir (bit 3) of the ACS control register (ECAP_ACS+6) on every bridge
# above an NVIDIA GPU, leaving the other ACS bits as they are. ACS state resets at boot, hence a unit.
ACS_SCRIPT = """#!/bin/sh
# Managed by specdeploy (gpu_host role): disable PCIe ACS redirect above the NVIDIA GPUs, so P2P goes direct.
set -eu
gpus=""
for dev in /sys/bus/pci/devices/*; do
  [ -e "$dev/vendor" ] && [ "$(cat "$dev/vendor")" = "0x10de" ] || continue
  case "$(cat "$dev/class")" in 0x0300*|0x0302*) gpus="$gpus $dev" ;; esac
done
[ -n "$gpus" ] || { echo "no NVIDIA GPU on the PCI bus: nothing to do"; exit 0; }
command -v setpci >/dev/null || { echo "setpci not found (install pciutils)" >&2; exit 1; }
for dev in $gpus; do
  path=$(readlink -f "$dev")
  while path=$(dirname "$path"); [ "${path#/sys/devices/pci}" != "$path" ]; do
    bdf=$(basename "$path")
    case "$bdf" in
      *:*:*.*) setpci -s "$bdf" ECAP_ACS+6.w=0000:000c 2>/dev/null && echo "ACS redirect off: $bdf" || true ;;
    esac
  done
done
"""

ACS_UNIT = """# Managed by specdeploy (gpu_host role)
[Unit]
Description=Disable PCIe ACS redirect above NVIDIA GPUs (NCCL P2P)
DefaultDependencies=no
After=sysinit.target
Before=docker.service nvidia-persistenced.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/specdeploy-acs-off

[Install]
WantedBy=multi-user.target
"""


# --------------------------------------------------------------------------------------------------------------
# gathering (read-only) and the report

GATHER = {
    "os": ". /etc/os-release; echo \"$ID $VERSION_ID ${VERSION_CODENAME:-}\"; uname -m",
    "smi": SMI_QUERY,
    "smi_table": "nvidia-smi",
    "smi_q": "nvidia-smi -q",
    "topo": "nvidia-smi topo -m",
    "nvrm": "cat /proc/driver/nvidia/version",
    "lspci": "lspci -vvv",
    "cmdline": "cat /proc/cmdline",
    "iommu_groups": "ls /sys/kernel/iommu_groups | wc -l",
    "fm": "systemctl show nvidia-fabricmanager -p LoadState -p ActiveState; "
          "journalctl -u nvidia-fabricmanager -n 40 --no-pager -o cat",
    "fm_version": "nv-fabricmanager --version",
    "pkgs": "dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n' 'nvidia-*' 'cuda-*' nvlsm docker-ce "
            "docker.io containerd.io",
    "persistenced": "systemctl is-active nvidia-persistenced",
    "docker": "command -v dockerd",
    "daemon_json": "cat /etc/docker/daemon.json",
}


def gather_script() -> str:
    """One shell script, read-only, printing each section between markers with its exit code."""
    parts = ["export LC_ALL=C PATH=$PATH:/usr/sbin:/sbin"]
    for name, cmd in GATHER.items():
        parts.append(f"echo '@@begin {name}'; ( {cmd} ) 2>&1; echo \"@@end {name} $?\"")
    return "\n".join(parts) + "\n"


def split_sections(output: str) -> dict[str, tuple[int, str]]:
    out: dict[str, tuple[int, str]] = {}
    for m in re.finditer(r"^@@begin (\w+)\n(.*?)^@@end \1 (\d+)$", output, re.M | re.S):
        out[m.group(1)] = (int(m.group(3)), m.group(2))
    return out


def _ok(sec: dict, name: str) -> str | None:
    rc, text = sec.get(name, (127, ""))
    return text if rc == 0 and text.strip() else None


@dataclass
class HostFacts:
    os_id: str = ""
    os_version: str = ""
    codename: str = ""
    arch: str = "x86_64"
    smi: Smi | None = None
    topo: Topology | None = None
    acs: Acs | None = None
    iommu: str = "unknown"
    open_modules: bool | None = None
    fabric: FabricManager | None = None
    fm_version: str | None = None
    packages: dict[str, str] = field(default_factory=dict)
    persistenced: bool = False
    docker: bool = False
    daemon_json: str | None = None

    @property
    def driver(self) -> str | None:
        return self.smi.driver if self.smi else None

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("os_id", "os_version", "codename", "arch", "iommu", "open_modules",
                                           "fm_version", "packages", "persistenced", "docker")}
        d["driver"] = self.driver
        d["smi"] = self.smi.to_dict() if self.smi else None
        d["acs"] = asdict(self.acs) if self.acs else None
        d["fabric"] = asdict(self.fabric) if self.fabric else None
        d["nvlink_gaps"] = nvlink_gaps(self.topo) if self.topo else None
        return d


def facts_from_sections(sec: dict[str, tuple[int, str]]) -> HostFacts:
    f = HostFacts()
    osl = (_ok(sec, "os") or "").split()
    if len(osl) >= 2:
        f.os_id, f.os_version = osl[0], osl[1]
        f.codename = osl[2] if len(osl) >= 4 else ""
        f.arch = osl[-1]
    smi_csv = _ok(sec, "smi")
    if smi_csv is not None:
        f.smi = parse_smi(smi_csv)
        table = _ok(sec, "smi_table")
        if table:
            f.smi.cuda = parse_smi(table).cuda
        q = _ok(sec, "smi_q")
        if q:
            byq = {g.bus_id: g for g in parse_smi(q).gpus}
            for g in f.smi.gpus:
                src = byq.get(g.bus_id)
                if src:
                    g.fabric_state, g.fabric_status = src.fabric_state, src.fabric_status
    topo = _ok(sec, "topo")
    if topo:
        try:
            f.topo = parse_topo(topo)
        except ValueError:
            f.topo = None
    lspci = _ok(sec, "lspci")
    if lspci is not None:
        f.acs = parse_acs_state(lspci)
    groups = _ok(sec, "iommu_groups")
    f.iommu = iommu_state(_ok(sec, "cmdline") or "", int(groups.strip()) if groups and groups.strip().isdigit()
                          else None)
    nvrm = _ok(sec, "nvrm")
    f.open_modules = open_kernel_module(nvrm) if nvrm else None
    fm = sec.get("fm", (1, ""))[1]
    f.fabric = parse_fabricmanager(fm)
    if "LoadState=not-found" in fm:
        f.fabric.state = "absent"
    fmv = _ok(sec, "fm_version")
    m = re.search(r"(\d{3}\.\d+\.\d+)", fmv or "")
    f.fm_version = m.group(1) if m else None
    for line in (_ok(sec, "pkgs") or "").splitlines():
        p = line.split()
        if len(p) >= 3 and p[2].startswith("ii"):
            f.packages[p[0]] = p[1]
    f.persistenced = (sec.get("persistenced", (1, ""))[1].strip() == "active")
    f.docker = _ok(sec, "docker") is not None
    f.daemon_json = _ok(sec, "daemon_json")
    return f


def check_host(host: str, hv, facts: HostFacts, acs_disable: bool = False) -> Report:
    """Every gap between this host and a serving one, each naming the host and the fix."""
    from specdeploy.nccl.env import resolve
    prof = hv.profile()
    rep = Report()
    provision = "run ansible-playbook ansible/provision.yml"
    if facts.os_id and cuda_repo_path(facts.os_id, facts.os_version) is None:
        rep.add("error", "operating system", f"{facts.os_id} {facts.os_version} is not supported (Ubuntu 22.04, "
                "Ubuntu 24.04 or Debian 12)", "install one of those", host)
    if hv.specdeploy_runtime == "docker" and not facts.docker:
        rep.add("warning" if not hv.specdeploy_sandbox else "info", "docker",
                "Docker Engine is not installed", f"{provision} (docker-ce from download.docker.com)", host)
    if facts.smi is None:
        if hv.specdeploy_sandbox:
            rep.add("info", "GPU", "no GPU (sandbox host): nvidia-smi is not installed; GPU checks skipped", host=host)
        else:
            rep.add("error", "GPU", "no NVIDIA driver: nvidia-smi is missing or fails",
                    f"{provision} (driver branch {prof.driver_branch} from NVIDIA's CUDA repository)", host)
        return rep
    smi = facts.smi
    if smi.count < prof.gpu_count:
        rep.add("error", "GPU count", f"{smi.count} GPU(s) visible; profile {prof.name} expects {prof.gpu_count}",
                "check the GPUs (nvidia-smi, dmesg for Xid/fallen-off-the-bus) or set specdeploy_hardware / "
                "specdeploy_tensor_parallel_size to what the host has", host)
    caps = {g.compute_cap for g in smi.gpus if g.compute_cap}
    if caps and caps != {prof.compute_capability}:
        rep.add("error", "compute capability", f"GPUs report {', '.join(sorted(caps))}; profile {prof.name} is "
                f"{prof.compute_capability}", "set specdeploy_hardware to this host's GPUs", host)
    for m in driver_findings(host, hv, smi.driver, smi.cuda, facts.open_modules):
        rep.findings.append(m)
    if prof.fabric_manager:
        fabric_findings(host, prof, facts, rep)
    if prof.nvswitch and facts.topo is not None:
        gaps = nvlink_gaps(facts.topo)
        if gaps:
            rep.add("error", "NVLink", "; ".join(f"{g} reaches {', '.join(p)} without NVLink" for g, p in
                                                 sorted(gaps.items())),
                    "check the fabric manager and the NVLink state (nvidia-smi nvlink -s); reseat or RMA the GPU/"
                    "baseboard", host)
    if prof.interconnect == "pcie":
        env, _ = resolve(hv)
        p2p = env.get("NCCL_P2P_DISABLE") != "1"
        if facts.acs is None or not facts.acs.known:
            rep.add("warning", "ACS", "ACS control could not be read (lspci -vvv as root)",
                    "install pciutils; run the check as root", host)
        elif facts.acs.redirect and p2p:
            where = ", ".join(facts.acs.redirect[:4]) + (" ..." if len(facts.acs.redirect) > 4 else "")
            if acs_disable:
                rep.add("info", "ACS", f"ACS redirect is on at {len(facts.acs.redirect)} bridge(s) ({where}); the "
                        "gpu_host role turns it off (gpu_host_acs_disable)", host=host)
            else:
                rep.add("error", "ACS", f"ACS redirect is on at {len(facts.acs.redirect)} bridge(s) ({where}) while "
                        "NCCL P2P is on: all-reduce can hang", "set gpu_host_acs_disable: true (setpci at every "
                        "boot), or let the gpu_host role turn NCCL P2P off for this host", host)
        if p2p and facts.iommu == "translated":
            rep.add("error", "IOMMU", "the IOMMU translates DMA (intel_iommu/amd_iommu on without iommu=pt) while "
                    "NCCL P2P is on: P2P transfers fault or hang", "add iommu=pt to the kernel command line and "
                    "reboot, or set NCCL_P2P_DISABLE=1 in specdeploy_nccl_env", host)
        elif p2p and facts.iommu == "unknown":
            rep.add("warning", "IOMMU", "the IOMMU mode is unknown", "check /proc/cmdline for iommu=pt", host)
    off = [g.index for g in smi.gpus if g.persistence is False]
    if off and not facts.persistenced:
        rep.add("warning", "persistence", f"persistence mode is off on GPU(s) {off} and nvidia-persistenced is "
                "not running", f"{provision} (enables nvidia-persistenced)", host)
    return rep


def driver_findings(host: str, hv, driver: str | None, reported_cuda: str | None, open_modules: bool | None):
    from specdeploy.values.errors import Finding
    prof = hv.profile()
    out: list[Finding] = []
    drv = version(driver)
    have = driver_cuda(driver, reported_cuda)
    fix = (f"install driver branch {prof.driver_branch} (ansible-playbook ansible/provision.yml "
           "-e gpu_host_reboot=true)")
    need_sm = SM_MIN_CUDA.get(prof.sm)
    if need_sm and have and have < need_sm:
        out.append(Finding("error", "driver", f"driver {driver} supports CUDA {_fmt(have)}; SM{prof.sm} needs CUDA "
                           f">= {_fmt(need_sm)}", fix, host))
    if hv.specdeploy_runtime == "docker":
        lo, hi = image_cuda(hv.specdeploy_engine, hv.specdeploy_engine_version)
        what = f"the {hv.specdeploy_engine} {hv.specdeploy_engine_version} image"
        if lo is None:
            out.append(Finding("warning", "driver", f"the CUDA version of {what} is not recorded: driver "
                               f"{driver} (CUDA {_fmt(have)}) not checked against it",
                               "compare `docker run --rm IMAGE env | grep CUDA_VERSION` with nvidia-smi", host))
        elif have is None:
            out.append(Finding("warning", "driver", f"driver {driver}: its CUDA version is unknown", fix, host))
        elif have < lo:
            out.append(Finding("error", "driver", f"driver {driver} supports CUDA {_fmt(have)}; {what} needs CUDA "
                               f"{_fmt(lo)}", fix, host))
        elif hi and have < hi:
            out.append(Finding("warning", "driver", f"driver {driver} supports CUDA {_fmt(have)}; {what} needs "
                               f"CUDA {_fmt(lo)} or {_fmt(hi)} (not recorded exactly)", fix, host))
    if drv and drv[0] != prof.driver_branch:
        out.append(Finding("info", "driver branch", f"driver {driver} is not on the profile's pinned branch "
                           f"{prof.driver_branch}", "", host))
    if prof.sm >= 100 and open_modules is False:
        out.append(Finding("error", "kernel module", f"Blackwell (SM{prof.sm}) runs only on NVIDIA's open kernel "
                           "modules; the proprietary module is loaded", "install nvidia-open (ansible-playbook "
                           "ansible/provision.yml -e gpu_host_reboot=true)", host))
    return out


def fabric_findings(host: str, prof: HardwareProfile, facts: HostFacts, rep: Report):
    fm, driver = facts.fabric, facts.driver
    fm_pkg = next((v for k, v in facts.packages.items() if k.startswith("nvidia-fabricmanager")), None)
    fm_ver = facts.fm_version or (fm_pkg.split("-")[0] if fm_pkg else None)
    want = f"nvidia-fabricmanager={driver}-*" if driver else "nvidia-fabricmanager matching the driver"
    if fm is not None and fm.mismatch:
        rep.add("error", "fabric manager", f"fabric manager {fm.fm_version} does not match driver "
                f"{fm.driver_version}", f"install {want} and hold it (ansible-playbook ansible/provision.yml)", host)
    elif fm_ver and driver and fm_ver != driver:
        rep.add("error", "fabric manager", f"fabric manager {fm_ver} does not match driver {driver}",
                f"install {want} and hold it (ansible-playbook ansible/provision.yml)", host)
    elif fm is None or fm.state in ("absent", "unknown") and not fm_ver:
        rep.add("error", "fabric manager", "nvidia-fabricmanager is not installed: CUDA fails with "
                "CUDA_ERROR_SYSTEM_NOT_READY on NVSwitch hosts", f"install {want} (ansible-playbook "
                "ansible/provision.yml)", host)
    elif fm.state != "running":
        rep.add("error", "fabric manager", f"nvidia-fabricmanager is {fm.state}" + (
            " (NV_WARN_NOTHING_TO_DO: no NVSwitch configured; on NVLink 5 hosts NVLSM must run)"
            if fm.no_nvswitch else ""), "journalctl -u nvidia-fabricmanager; ansible-playbook "
            "ansible/provision.yml starts it", host)
    if prof.nvlsm and "nvlsm" not in facts.packages:
        rep.add("error", "nvlsm", f"{prof.name} (NVLink 5) needs the NVLink subnet manager; nvlsm is not installed",
                "install nvlsm (ansible-playbook ansible/provision.yml)", host)
    states = {g.fabric_state for g in facts.smi.gpus if g.fabric_state} if facts.smi else set()
    pending = states - {"Completed", "N/A", "Not Supported"}
    if pending:
        rep.add("error", "fabric registration", f"GPU fabric state {', '.join(sorted(pending))} (not Completed)",
                "wait for the fabric manager; check nvidia-smi -q | grep -A2 Fabric", host)


def host_decisions(host: str, hv, output: str, acs_disable: bool = False) -> dict:
    """Everything the gpu_host role applies, decided here from the gather script's output."""
    from specdeploy.nccl.env import resolve
    from specdeploy.plan.render.paths import unit_name
    facts = facts_from_sections(split_sections(output))
    rep = check_host(host, hv, facts, acs_disable)
    prof = hv.profile()
    env, source = resolve(hv)
    redirect = bool(facts.acs and facts.acs.redirect)
    p2p_on = env.get("NCCL_P2P_DISABLE") != "1"
    p2p_off_reason = None
    if prof.interconnect == "pcie" and p2p_on and redirect and not acs_disable:
        p2p_off_reason = (f"ACS redirect is on at {len(facts.acs.redirect)} PCIe bridge(s) and "
                          "gpu_host_acs_disable is false: NCCL P2P would hang, so it is off for this host")
    # errors the role itself resolves in this run are not reasons to stop it
    fixed = {"ACS"} if p2p_off_reason or acs_disable else set()
    if p2p_off_reason:
        fixed.add("IOMMU")
    blocking = [f.line() for f in rep.errors if f.subject not in fixed]
    plan = install_plan(prof, facts.os_id or "unknown", facts.os_version, facts.codename, facts.arch, facts.driver)
    return {
        "facts": facts.to_dict(), "ok": rep.ok, "findings": [f.to_dict() for f in rep.findings],
        "lines": [f.line() for f in rep.findings], "blocking": blocking, "plan": plan,
        "gpu": facts.smi is not None, "driver": facts.driver,
        # a working driver that the engine accepts stays; a missing or failing one is replaced by the pinned branch
        "install_driver": not hv.specdeploy_sandbox and (facts.smi is None or any(
            f.subject in ("driver", "kernel module", "GPU") for f in rep.errors)),
        "install_docker": hv.specdeploy_runtime == "docker" and not facts.docker,
        "driver_on_branch": bool(version(facts.driver) and version(facts.driver)[0] == prof.driver_branch),
        "acs_disable": bool(acs_disable and prof.interconnect == "pcie"),
        "nccl_env": dict(env, NCCL_P2P_DISABLE="1") if p2p_off_reason else None, "nccl_env_source": source,
        "p2p_off_reason": p2p_off_reason, "engine_unit": unit_name(hv.specdeploy_engine),
        "daemon_json": docker_daemon_config(facts.daemon_json, gpus=not hv.specdeploy_sandbox and prof.gpu_count > 0),
    }


# --------------------------------------------------------------------------------------------------------------
# over SSH

def ssh_argv(host: str, variables: dict) -> list[str]:
    addr = str(variables.get("ansible_host", host))
    user = variables.get("ansible_user")
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
    if variables.get("ansible_port"):
        argv += ["-p", str(variables["ansible_port"])]
    if variables.get("ansible_ssh_private_key_file"):
        argv += ["-i", str(variables["ansible_ssh_private_key_file"])]
    argv += shlex.split(str(variables.get("ansible_ssh_common_args") or ""))
    argv += shlex.split(str(variables.get("ansible_ssh_extra_args") or ""))
    argv.append(f"{user}@{addr}" if user else addr)
    return argv


def probe(host: str, variables: dict, timeout: float = 120) -> tuple[HostFacts | None, str | None]:
    """Run the read-only gather script on the host (as root through ``sudo -n`` when not root)."""
    script = gather_script()
    user = variables.get("ansible_user")
    remote = "sh -s" if user in (None, "root") else "if sudo -n true 2>/dev/null; then sudo -n sh -s; else sh -s; fi"
    try:
        r = subprocess.run(ssh_argv(host, variables) + [remote], input=script, capture_output=True, text=True,
                           timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"ssh failed: {exc}"
    if r.returncode == 255 or "@@begin" not in r.stdout:
        return None, (r.stderr.strip().splitlines() or [f"ssh exited {r.returncode}"])[-1]
    return facts_from_sections(split_sections(r.stdout)), None


def preflight_hosts(inventory: str, limit: str | None = None, extra: dict | None = None,
                    probe_fn=probe, vault=None) -> dict[str, Report]:
    """``specdeploy preflight --hosts``: read every engine host over SSH (read-only) and report each gap."""
    from pathlib import Path

    from specdeploy.values.errors import Finding, SpecdeployError
    from specdeploy.hostvars.inventory import _check_path, engine_host_names, host_variables
    from specdeploy.hostvars.schema import validate_host
    path = Path(inventory)
    _check_path(path)
    from concurrent.futures import ThreadPoolExecutor
    inv, all_vars = host_variables(path, extra, vault)

    def one(name: str) -> Report:
        rep = Report()
        variables = all_vars[name]
        if isinstance(variables, SpecdeployError):
            rep.extend(variables.problems)
            return rep
        try:
            hv = validate_host(name, variables)
        except SpecdeployError as exc:
            rep.extend(exc.problems)
            return rep
        facts, err = probe_fn(name, variables)
        if facts is None:
            rep.findings.append(Finding("error", "ssh", f"cannot read the host: {err}",
                                        "check ansible_host/ansible_user/ansible_ssh_private_key_file and that "
                                        "the host is up", name))
            return rep
        acs_off = str(variables.get("gpu_host_acs_disable", False)).lower() in ("true", "1", "yes")
        rep.extend(check_host(name, hv, facts, acs_off).findings)
        return rep

    names = engine_host_names(inv, path, limit)
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(names)))) as pool:
        return dict(zip(names, pool.map(one, names)))
