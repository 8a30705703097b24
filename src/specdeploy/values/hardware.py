"""Hardware profiles: what a host is, and the defaults that follow from it.

Every NCCL variable a profile sets carries the reason it changes behaviour on that hardware; variables that
NCCL documents as debugging-only and that do not change behaviour on the hardware are left out.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class EnvVar:
    value: str
    reason: str


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    description: str
    gpu_count: int
    gpu_memory_gib: float
    compute_capability: str
    interconnect: Literal["pcie", "nvlink"]
    nvswitch: bool
    fabric_manager: bool
    nccl_env: dict[str, EnvVar] = field(default_factory=dict)
    # Host provisioning (gpu_host role): the NVIDIA driver branch apt is pinned to (580: the production branch
    # that supports B200, H200 and RTX PRO 6000 Blackwell, CUDA 13.0); the open kernel modules (the only ones
    # Blackwell runs on); NVLSM, which NVLink 5 NVSwitch systems (B200 and later) need beside the fabric manager.
    driver_branch: int = 580
    open_modules: bool = True
    nvlsm: bool = False
    # Per-GPU peaks for the verification-cost roofline (verifycost.py): HBM/GDDR bandwidth in GB/s and dense
    # (no sparsity) BF16 tensor-core TFLOPS, from the vendor's datasheet; None where not known.
    hbm_bandwidth_gbs: float | None = None
    bf16_dense_tflops: float | None = None
    # RDMA NICs between hosts (InfiniBand or RoCE), as the platform ships them: what cross-host tensor
    # parallelism and KV transfer need. A host may differ (specdeploy_rdma); preflight --hosts reads the devices.
    rdma: bool = False

    @property
    def sm(self) -> int:
        major, minor = self.compute_capability.split(".")
        return int(major) * 10 + int(minor)

    def nccl_env_values(self) -> dict[str, str]:
        return {k: v.value for k, v in self.nccl_env.items()}


RTX_PRO_6000_PCIE = HardwareProfile(
    name="rtx_pro_6000_pcie",
    description="8x RTX PRO 6000 Blackwell Server Edition (SM120, 96 GiB) on PCIe, no NVLink",
    gpu_count=8,
    gpu_memory_gib=96.0,
    compute_capability="12.0",
    interconnect="pcie",
    nvswitch=False,
    fabric_manager=False,
    rdma=False,  # PCIe servers: the NICs are the integrator's choice, so the profile claims none
    # NVIDIA RTX PRO 6000 Blackwell Server Edition datasheet: 96 GB GDDR7, 512-bit at 28 Gbps = 1792 GB/s;
    # 4000 AI TOPS is FP4 with sparsity, which puts dense BF16 (FP32 accumulate) at 4000 / 8 = 500 TFLOPS.
    hbm_bandwidth_gbs=1792.0,
    bf16_dense_tflops=500.0,
    nccl_env={
        "NCCL_P2P_LEVEL": EnvVar(
            "SYS",
            "The GPUs meet at the CPU root complex or across sockets; NCCL's default P2P cutoff (PXB) sends "
            "every all-reduce through host memory (SHM). SYS enables PCIe P2P, which is safe only with ACS "
            "redirect off and IOMMU in passthrough (the gpu_host role checks both).",
        ),
    },
)

B200_NVL8 = HardwareProfile(
    name="b200_nvl8",
    description="8x B200 (SM100, 180 GiB) on NVLink 5 through NVSwitch",
    gpu_count=8,
    gpu_memory_gib=180.0,
    compute_capability="10.0",
    interconnect="nvlink",
    nvswitch=True,
    fabric_manager=True,
    nccl_env={},
    nvlsm=True,
    rdma=True,  # HGX B200: eight ConnectX-7 400 Gb/s NICs, one per GPU
    # NVIDIA DGX/HGX B200 datasheet: 8 TB/s HBM3e per GPU; BF16 tensor 4.5 PFLOPS with sparsity, 2.25 dense.
    hbm_bandwidth_gbs=8000.0,
    bf16_dense_tflops=2250.0,
)

H200_NVL8 = HardwareProfile(
    name="h200_nvl8",
    description="8x H200 (SM90, 141 GB) on NVLink 4 through NVSwitch",
    gpu_count=8,
    gpu_memory_gib=140.0,
    compute_capability="9.0",
    interconnect="nvlink",
    nvswitch=True,
    fabric_manager=True,
    nccl_env={},
    rdma=True,  # HGX H200: eight ConnectX-7 400 Gb/s NICs, one per GPU
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): 4.8 TB/s HBM3e; BF16 tensor 1979 TFLOPS with sparsity,
    # 989 dense.
    hbm_bandwidth_gbs=4800.0,
    bf16_dense_tflops=989.0,
)

PROFILES: dict[str, HardwareProfile] = {p.name: p for p in (RTX_PRO_6000_PCIE, B200_NVL8, H200_NVL8)}
PROFILE_NAMES = tuple(PROFILES) + ("custom",)


def custom_profile(spec: dict) -> HardwareProfile:
    """Build the ``custom`` profile from ``specdeploy_hardware_custom`` (already schema-validated)."""
    env = {k: EnvVar(str(v), "set by specdeploy_hardware_custom.nccl_env") for k, v in spec.get("nccl_env", {}).items()}
    return HardwareProfile(
        name="custom",
        description=spec.get("description", "custom hardware"),
        gpu_count=spec["gpu_count"],
        gpu_memory_gib=spec["gpu_memory_gib"],
        compute_capability=spec["compute_capability"],
        interconnect=spec["interconnect"],
        nvswitch=spec.get("nvswitch", False),
        fabric_manager=spec.get("nvswitch", False),
        nccl_env=env,
        nvlsm=spec.get("nvswitch", False) and int(spec["compute_capability"].split(".")[0]) >= 10,
        hbm_bandwidth_gbs=spec.get("hbm_bandwidth_gbs"),
        bf16_dense_tflops=spec.get("bf16_dense_tflops"),
        rdma=spec.get("rdma", False),
    )


def get_profile(name: str, custom: dict | None = None) -> HardwareProfile:
    if name == "custom":
        return custom_profile(custom or {})
    return PROFILES[name]
