"""Gathering a host's facts (read-only: one shell script, its output in sections), and the report: what
follows from the facts for the chosen engine, hardware profile and variables."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from specdeploy.gpuhost import groupnet
from specdeploy.gpuhost.fabric import FabricManager, parse_fabricmanager
from specdeploy.gpuhost.install import cuda_repo_path, docker_daemon_config, install_plan
from specdeploy.gpuhost.smi import SMI_QUERY, Smi, parse_smi
from specdeploy.gpuhost.pcie import Acs, iommu_state, nvlink_gaps, open_kernel_module, parse_acs_state, parse_topo
from specdeploy.gpuhost.versions import SM_MIN_CUDA, _fmt, driver_cuda, image_cuda, version
from specdeploy.nccl.pcie import PcieTopology
from specdeploy.values.errors import Report
from specdeploy.values.hardware import HardwareProfile

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
    **groupnet.GATHER,
}


def gather_script(reach: tuple[str, int] | None = None) -> str:
    """One shell script, read-only, printing each section between markers with its exit code; ``reach``: the
    (address, port) of this host's group leader's rendezvous, for a rank that joins one."""
    parts = ["export LC_ALL=C PATH=$PATH:/usr/sbin:/sbin"]
    sections = dict(GATHER)
    if reach is not None:
        sections["reach"] = groupnet.reach_command(*reach)
    for name, cmd in sections.items():
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
    topo: PcieTopology | None = None
    acs: Acs | None = None
    iommu: str = "unknown"
    open_modules: bool | None = None
    fabric: FabricManager | None = None
    fm_version: str | None = None
    packages: dict[str, str] = field(default_factory=dict)
    persistenced: bool = False
    docker: bool = False
    daemon_json: str | None = None
    # a serving group's network (groupnet): None where it could not be read
    rdma: dict[str, list[str]] | None = None
    interfaces: dict[str, list[str]] | None = None
    listening: set[int] | None = None
    ntp_synced: bool | None = None
    reach: dict | None = None  # a rank that joins a leader: groupnet.parse_reach of its route and connection

    @property
    def driver(self) -> str | None:
        return self.smi.driver if self.smi else None

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("os_id", "os_version", "codename", "arch", "iommu", "open_modules",
                                           "fm_version", "packages", "persistenced", "docker", "rdma",
                                           "interfaces", "ntp_synced", "reach")}
        d["listening"] = sorted(self.listening) if self.listening is not None else None
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
    rc, text = sec.get("rdma", (127, ""))
    f.rdma = groupnet.parse_rdma(text) if rc == 0 else None
    rc, text = sec.get("netif", (127, ""))
    f.interfaces = groupnet.parse_interfaces(text) if rc == 0 else None
    rc, text = sec.get("listen", (127, ""))
    f.listening = groupnet.parse_listening(text) if rc == 0 else None
    if "reach" in sec:
        f.reach = groupnet.parse_reach(sec["reach"][1])
    clock = _ok(sec, "clock")
    f.ntp_synced = {"yes": True, "no": False}.get(clock.strip()) if clock else None
    return f


def check_host(host: str, hv, facts: HostFacts, acs_disable: bool = False, rank=None) -> Report:
    """Every gap between this host and a serving one, each naming the host and the fix; ``rank``: the host's
    place in its serving group (values.topology.Rank), whose network needs are checked too."""
    from specdeploy.nccl.env import resolve
    prof = hv.profile()
    rep = Report()
    groupnet.layout_findings(host, hv, rank, facts, rep)
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
