"""NCCL all-reduce autotuning: measure candidate environments, choose one (or a per-size table), explain it."""

# The environment the team in the seeds hand-tuned on 8x RTX PRO 6000 PCIe.
SEEDS_ENV = {
    "NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16",
    "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512", "CUDA_DEVICE_MAX_CONNECTIONS": "1",
}

DECODE_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PREFILL_TOKENS = (2048, 8192)


def default_candidates(pcie: bool = False) -> dict[str, dict[str, str]]:
    """The default, the seeds' set, and a small grid over protocol, algorithm, P2P level and CTA counts."""
    c: dict[str, dict[str, str]] = {"default": {}, "seeds": dict(SEEDS_ENV)}
    # Algorithm x protocol pairs: each maps onto one row of the per-size tuner-plugin table.
    for algo in ("Ring", "Tree"):
        for proto in ("LL", "LL128", "Simple"):
            c[f"{algo}/{proto}"] = {"NCCL_ALGO": algo, "NCCL_PROTO": proto}
    c["min_ctas=16"] = {"NCCL_MIN_CTAS": "16"}
    c["max_ctas=4"] = {"NCCL_MAX_CTAS": "4"}
    if pcie:
        for lvl in ("PHB", "SYS"):
            c[f"p2p_level={lvl}"] = {"NCCL_P2P_LEVEL": lvl}
        c["p2p_level=SYS,proto=LL"] = {"NCCL_P2P_LEVEL": "SYS", "NCCL_PROTO": "LL"}
    return c
