"""The serving layouts and one rank of a serving group: the values the schema, the adapters and the plan share.

A *serving group* is the set of hosts that serve one model instance together. ``single``: every host is its own
instance (a group of one). ``tp``: the group's hosts form one tensor-parallel world (TP = GPUs per host x hosts).
``dp_ep``: data-parallel attention with expert parallelism over every GPU of the group. ``pd``: prefill and
decode instances, one host each, that the router pairs (KV caches move from prefill to decode).

Which host is which rank is decided in ``topology/`` from the inventory; the adapters turn a :class:`Rank` into
that rank's command line (``EngineAdapter.command(hv, drafter, rank)``).
"""
from __future__ import annotations

from dataclasses import dataclass

LAYOUTS = ("single", "tp", "dp_ep", "pd")
MULTI_HOST = ("tp", "dp_ep")  # layouts whose ranks form one engine across hosts
PD_ROLES = ("prefill", "decode")

LAYOUT_TEXT = {
    "single": "one whole model copy per host",
    "tp": "tensor parallel across the group's hosts",
    "dp_ep": "data-parallel attention with expert parallelism across the group's hosts",
    "pd": "prefill and decode instances behind the router in PD mode",
}


@dataclass(frozen=True)
class Rank:
    """One host's place in its serving group."""

    layout: str                 # one of LAYOUTS
    group: str                  # the serving group's name
    index: int                  # node rank: 0 is the leader (the one that serves HTTP)
    hosts: tuple[str, ...]      # the group's hosts in rank order
    leader_address: str         # where the other ranks reach the leader
    address: str                # where the other ranks reach this host
    port: int                   # the leader's rendezvous port
    gpus: int                   # GPUs per host (every rank has the same)
    tp_per_dp: int = 1          # dp_ep: tensor-parallel size inside one data-parallel rank
    role: str | None = None     # pd: prefill or decode
    interface: str | None = None  # the network interface NCCL and Gloo use between hosts
    pd_port: int = 0            # pd: the KV-transfer side channel (SGLang's bootstrap port, NIXL's side channel)
    transfer: str = "nixl"      # pd: the KV-transfer backend
    addresses: tuple[str, ...] = ()  # tp, dp_ep: where the group's ranks are reached, in rank order

    @property
    def size(self) -> int:
        return len(self.hosts)

    @property
    def leader(self) -> bool:
        return self.index == 0

    @property
    def world(self) -> int:
        """GPUs of the whole group."""
        return self.gpus * self.size

    @property
    def dp_size(self) -> int:
        return self.world // self.tp_per_dp

    @property
    def dp_local(self) -> int:
        return self.gpus // self.tp_per_dp

    @property
    def multi_host(self) -> bool:
        return self.layout in MULTI_HOST and self.size > 1

    def to_dict(self) -> dict:
        return {"layout": self.layout, "group": self.group, "rank": self.index, "hosts": list(self.hosts),
                "leader": self.hosts[0], "leader_address": self.leader_address, "address": self.address,
                "port": self.port, "gpus": self.gpus, "world": self.world, "role": self.role,
                "interface": self.interface, "addresses": list(self.addresses)}
