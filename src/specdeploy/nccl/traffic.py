"""Which all-reduce sizes reach NCCL: the engine's own paths (custom all-reduce, symmetric memory, fusions)
take the rest. The facts live in the engine adapters; this module only asks them."""
from __future__ import annotations

from dataclasses import dataclass, field

from specdeploy.engines import AllReducePath, CommContext, UnsupportedVersion, get_adapter
from specdeploy.values.hardware import PROFILES, HardwareProfile


class TrafficError(ValueError):
    pass


@dataclass
class Traffic:
    label: str
    paths: list[AllReducePath] = field(default_factory=list)

    def reaches_nccl(self, nbytes: int) -> bool | None:
        """True: NCCL carries it; False: an engine path takes it; None: not known."""
        takes = [p.takes(nbytes) for p in self.paths]
        if any(t is True for t in takes):
            return False
        if any(t is None for t in takes):
            return None
        return True

    def to_dict(self) -> dict:
        return {"label": self.label, "paths": [{"name": p.name, "max_bytes": p.max_bytes,
                                                "inclusive": p.inclusive, "source": p.source} for p in self.paths]}


ALL_SIZES = Traffic("every size (no engine given: as with custom all-reduce off and no other engine path)")


def context(profile: HardwareProfile, world_size: int, custom_all_reduce: bool) -> CommContext:
    return CommContext(compute_capability=profile.compute_capability, world_size=world_size,
                       nvlink=profile.interconnect == "nvlink", multicast=profile.nvswitch and profile.fabric_manager,
                       custom_all_reduce=custom_all_reduce)


def traffic(engine: str, version: str, profile: HardwareProfile | str, world_size: int,
            custom_all_reduce: bool | None = None) -> Traffic:
    """The engine's paths in front of NCCL on ``profile`` at tensor-parallel size ``world_size``.
    ``custom_all_reduce=None`` takes the profile's default for the engine."""
    if isinstance(profile, str):
        if profile not in PROFILES:
            raise TrafficError(f"unknown hardware profile '{profile}'; known: {', '.join(PROFILES)}")
        profile = PROFILES[profile]
    try:
        adapter = get_adapter(engine, version)
    except UnsupportedVersion as exc:
        raise TrafficError(str(exc)) from None
    if custom_all_reduce is None:
        custom_all_reduce = not adapter.profile_defaults(profile).get("disable_custom_all_reduce", False)
    ctx = context(profile, world_size, custom_all_reduce)
    label = (f"{engine} {version} on {profile.name} (SM{profile.sm}, {profile.interconnect}), TP {world_size}, "
             f"custom all-reduce {'on' if custom_all_reduce else 'off'}")
    return Traffic(label, adapter.allreduce_paths(ctx))


def traffic_for_host(hv, world_size: int | None = None) -> Traffic:
    """Same, from a host's validated variables (profile, engine, version, custom all-reduce switch)."""
    adapter = get_adapter(hv.specdeploy_engine, hv.specdeploy_engine_version)
    custom = not adapter.resolved(hv, "disable_custom_all_reduce")
    prof = hv.profile()
    return traffic(hv.specdeploy_engine, hv.specdeploy_engine_version, prof, world_size or hv.tp, custom)
