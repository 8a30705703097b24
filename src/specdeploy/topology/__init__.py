"""Serving groups: which hosts serve one model instance together and how (docs/topology.md)."""
from specdeploy.topology.groups import (Member, group_problems, groups, inventory_ranks, pd_instances, resolve,
                                        router_workers)

__all__ = ["Member", "group_problems", "groups", "inventory_ranks", "pd_instances", "resolve", "router_workers"]
