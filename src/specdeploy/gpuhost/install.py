"""What a bare host needs: repositories and packages per hardware profile, the docker daemon's
config, and the ACS unit (its script and unit are files beside this module)."""
from __future__ import annotations

import json
from pathlib import Path

from specdeploy.gpuhost.versions import version
from specdeploy.values.hardware import HardwareProfile

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
FILES = Path(__file__).with_name("files")
ACS_SCRIPT = (FILES / "specdeploy-acs-off.sh").read_text()

ACS_UNIT = (FILES / "specdeploy-acs.service").read_text()
