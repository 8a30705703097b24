"""PcieTopology checks that explain when NCCL P2P cannot or should not be used: ``nvidia-smi topo -m``,
PCIe ACS redirect (``lspci -vvv``) and the IOMMU mode (kernel command line)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

LINK_RANK = {"X": 0, "NV": 1, "PIX": 2, "PXB": 3, "PHB": 4, "NODE": 5, "SYS": 6}
P2P_LEVEL_FOR = {"NV": "NVL", "PIX": "PIX", "PXB": "PXB", "PHB": "PHB", "NODE": "PHB", "SYS": "SYS"}


@dataclass
class PcieTopology:
    gpus: list[str]
    links: dict[tuple[str, str], str] = field(default_factory=dict)

    def worst_link(self) -> str:
        kinds = [("NV" if v.startswith("NV") else v) for v in self.links.values()]
        return max(kinds, key=lambda k: LINK_RANK.get(k, 7)) if kinds else "X"

    @property
    def nvlink_all(self) -> bool:
        return bool(self.links) and all(v.startswith("NV") for v in self.links.values())


def parse_topo_matrix(text: str) -> PcieTopology:
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    header = next((line for line in lines if re.match(r"^\s*GPU0\b", line)), None)
    if header is None:
        raise ValueError("not an `nvidia-smi topo -m` matrix: no GPU0 header")
    cols = header.split()
    gpu_cols = [c for c in cols if re.fullmatch(r"GPU\d+", c)]
    topo = PcieTopology(gpus=gpu_cols)
    for line in lines:
        parts = line.split()
        if not parts or not re.fullmatch(r"GPU\d+", parts[0]):
            continue
        row = parts[0]
        for col, val in zip(cols, parts[1:]):
            if col in gpu_cols and col != row:
                topo.links[(row, col)] = val
    return topo


def parse_acs(lspci_vvv: str) -> dict[str, bool]:
    """Map PCI address -> True when ACS redirect (ReqRedir/CmpltRedir) is enabled on that bridge."""
    out: dict[str, bool] = {}
    dev = None
    for line in lspci_vvv.splitlines():
        m = re.match(r"^([0-9a-f]{2,4}:[0-9a-f]{2}:[0-9a-f]{2}\.\d|[0-9a-f]{2}:[0-9a-f]{2}\.\d)\s", line)
        if m:
            dev = m.group(1)
            continue
        if dev and "ACSCtl:" in line:
            out[dev] = bool(re.search(r"ReqRedir\+|CmpltRedir\+", line))
    return out


def iommu_mode(cmdline: str, iommu_groups: int | None = None) -> str:
    """'off', 'passthrough', 'translated' or 'unknown'."""
    if re.search(r"\b(intel_iommu|amd_iommu|iommu)=off\b", cmdline):
        return "off"
    if re.search(r"\biommu=pt\b|\biommu\.passthrough=1\b", cmdline):
        return "passthrough"
    if iommu_groups == 0:
        return "off"
    if iommu_groups:
        return "translated"
    return "unknown"


def explain(topo: PcieTopology, acs: dict[str, bool] | None = None, iommu: str = "unknown") -> list[str]:
    notes = []
    worst = topo.worst_link()
    if topo.nvlink_all:
        notes.append("All GPU pairs are connected by NVLink: NCCL uses P2P over NVLink without any P2P_LEVEL.")
        return notes
    notes.append(f"The farthest GPU pair is connected through {worst}.")
    if LINK_RANK.get(worst, 7) > LINK_RANK["PXB"]:
        notes.append(f"NCCL's default P2P cutoff is PXB, so pairs across {worst} go through host memory (SHM) "
                     f"unless NCCL_P2P_LEVEL={P2P_LEVEL_FOR.get(worst, 'SYS')} is set.")
    redirect = [d for d, on in (acs or {}).items() if on]
    if redirect:
        notes.append(f"ACS redirect is enabled on {len(redirect)} bridge(s) ({', '.join(redirect[:4])}): PCIe P2P "
                     "traffic detours through the root complex and can hang NCCL; disable ACS (setpci) before "
                     "enabling P2P.")
    if iommu == "translated":
        notes.append("The IOMMU translates DMA: P2P between GPUs can hang; boot with iommu=pt (or amd_iommu=off).")
    elif iommu == "unknown":
        notes.append("The IOMMU mode is unknown: check /proc/cmdline for iommu=pt and ls /sys/kernel/iommu_groups.")
    return notes
