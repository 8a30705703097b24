"""The NVIDIA fabric manager: its status and journal (NVSwitch hosts)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field


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
