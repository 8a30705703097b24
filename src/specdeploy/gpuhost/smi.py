"""nvidia-smi: its table, ``-q`` and ``--query-gpu`` CSV forms, read into one ``Smi``."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from specdeploy.gpuhost.versions import version


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
