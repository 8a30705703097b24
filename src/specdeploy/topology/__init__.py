"""Serving groups: which hosts serve one model instance together and how (docs/topology.md)."""
from specdeploy.topology.groups import (Member, check_members, group_problems, groups, inventory_ranks, pd_instances,
                                        resolve, router_workers)
from specdeploy.topology.rollout import (batch_problems, batch_sizes, mates, rolling_batches, serial_problems,
                                         start_order)

__all__ = ["Member", "batch_problems", "batch_sizes", "check_members", "group_problems", "groups", "inventory_ranks",
           "mates", "pd_instances", "resolve", "rolling_batches", "router_workers", "serial_problems", "start_order"]
