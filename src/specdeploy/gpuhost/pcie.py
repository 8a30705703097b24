"""PCIe and NVLink topology, ACS redirect, the IOMMU and the kernel module, read from the host's own tools."""
from __future__ import annotations

import re
from dataclasses import dataclass

from specdeploy.nccl.pcie import PcieTopology, iommu_mode, parse_acs, parse_topo_matrix


def parse_topo(text: str) -> PcieTopology:
    """``nvidia-smi topo -m``; also a matrix pasted without its header row: GPU columns come first, so row GPUk
    names its links to GPU0..GPU(n-1) for the n rows present."""
    first = next((ln.split() for ln in text.splitlines() if re.match(r"^\s*GPU0\b", ln)), None)
    if first and first[1:2] != ["X"]:
        return parse_topo_matrix(text)
    rows = [line.split() for line in text.splitlines() if re.match(r"^\s*GPU\d+\s", line)]
    if not rows:
        raise ValueError("not an `nvidia-smi topo -m` matrix: no GPU rows")
    names = [r[0] for r in rows]
    topo = PcieTopology(gpus=names)
    for r in rows:
        for col, val in zip(names, r[1:]):
            if col != r[0]:
                topo.links[(r[0], col)] = val
    return topo


def nvlink_gaps(topo: PcieTopology) -> dict[str, list[str]]:
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
