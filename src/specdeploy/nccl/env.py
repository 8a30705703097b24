"""Which NCCL environment a host's engine unit gets: the host's tuned choice, else its profile's default."""
from __future__ import annotations

from specdeploy.hostvars.schema import HostVars


def resolve(hv: HostVars) -> tuple[dict[str, str], str]:
    """Return (env, source) where source names where the values came from."""
    if hv.specdeploy_nccl_env is not None:
        return dict(hv.specdeploy_nccl_env), "tuned"
    prof = hv.profile()
    return prof.nccl_env_values(), f"profile:{prof.name}"
