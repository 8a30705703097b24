"""What a serving group needs of each host's network (``preflight --hosts``): the RDMA devices its layout needs,
the interface NCCL and Gloo are told to use with the address the other ranks reach, the rendezvous and KV-transfer
ports, a synchronised clock, and from each rank that joins a leader, the leader's rendezvous port reachable by the
route the named interface gives. Read by the same read-only gather script as the GPU facts."""
from __future__ import annotations

import ipaddress
import re
import shlex

from specdeploy.values.errors import Report

GATHER = {
    # every RDMA device with each port's state (InfiniBand, or RoCE over Ethernet: both appear here)
    "rdma": "for p in /sys/class/infiniband/*/ports/*; do [ -e \"$p/state\" ] && "
            "echo \"$(basename $(dirname $(dirname $p))) $(basename $p) $(cat $p/state)\"; done; true",
    "netif": "ip -o addr show",
    "listen": "ss -Htln",
    "clock": "timedatectl show -p NTPSynchronized --value",
}


REACH_TIMEOUT_S = 3


def reach_command(address: str, port: int) -> str:
    """The route to the leader and one TCP connection to its rendezvous port (bash's /dev/tcp; nothing is sent).
    Refused proves the leader's host answers (its engine is not up yet); a timeout means the packets are dropped."""
    a, p = shlex.quote(address), int(port)
    return (f"ip -o route get {a} 2>&1; timeout {REACH_TIMEOUT_S} bash -c 'exec 3<>/dev/tcp/\"$0\"/\"$1\"' {a} {p} "
            "2>&1; echo \"tcp $?\"")


def parse_reach(text: str) -> dict:
    """{"dev": the interface the route leaves by or None, "tcp": connected|refused|unreachable|timeout|None}."""
    m = re.search(r"\bdev (\S+)", text)
    rc = re.search(r"^tcp (\d+)\s*$", text, re.M)
    tcp = None
    if rc:
        code = int(rc.group(1))
        if code == 0:
            tcp = "connected"
        elif code == 124:
            tcp = "timeout"
        elif re.search(r"(?i)connection refused", text):
            tcp = "refused"
        elif re.search(r"(?i)no route to host|network is unreachable|host is unreachable|name or service", text):
            tcp = "unreachable"
    return {"dev": m.group(1) if m else None, "tcp": tcp}


def parse_rdma(text: str) -> dict[str, list[str]]:
    """device -> the state of each port ("4: ACTIVE" -> "ACTIVE")."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3:
            out.setdefault(parts[0], []).append(parts[2].split(":")[-1].strip())
    return out


def parse_interfaces(text: str) -> dict[str, list[str]]:
    """interface -> its addresses, from ``ip -o addr show``."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"\d+:\s+(\S+?)(@\S+)?\s+inet6?\s+(\S+)", line)
        if m:
            out.setdefault(m.group(1), []).append(m.group(3).split("/")[0])
    return out


def parse_listening(text: str) -> set[int]:
    out: set[int] = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            port = parts[3].rsplit(":", 1)[-1]
            if port.isdigit():
                out.add(int(port))
    return out


def _is_ip(a: str) -> bool:
    try:
        ipaddress.ip_address(a.strip("[]"))
        return True
    except ValueError:
        return False


def layout_findings(host: str, hv, rank, facts, rep: Report) -> None:
    """The host's gaps for its place in its serving group (nothing for a host of its own)."""
    if rank is None or rank.layout == "single":
        return
    cross = rank.multi_host or rank.layout == "pd"
    needs_rdma = rank.layout == "tp" and rank.multi_host or rank.layout == "pd"
    if needs_rdma and hv.rdma:
        active = [d for d, states in (facts.rdma or {}).items() if "ACTIVE" in states]
        if facts.rdma is None:
            rep.add("warning", "RDMA", "the RDMA devices could not be read (/sys/class/infiniband)",
                    "run the check as root on the host", host)
        elif not facts.rdma:
            level = "info" if hv.specdeploy_sandbox else "error"
            rep.add(level, "RDMA", f"serving group {rank.group} is {rank.layout} across hosts, which needs RDMA, but "
                    "the host has no RDMA device (/sys/class/infiniband is empty)"
                    + ("; a sandbox host has none, so this is checked on real hosts only" if hv.specdeploy_sandbox
                       else ""), "install the NICs' driver (rdma-core, the mlx5 modules) or set specdeploy_rdma: "
                    "false and choose a layout that needs no RDMA (dp_ep or single)", host)
        elif not active:
            ports = "; ".join(f"{d}: {', '.join(s)}" for d, s in sorted(facts.rdma.items()))
            rep.add("error", "RDMA", f"no RDMA port is ACTIVE ({ports})", "check the cables, the subnet manager "
                    "(InfiniBand) or the link (RoCE): ibstat, rdma link", host)
    if cross and rank.interface and facts.interfaces is not None:
        if rank.interface not in facts.interfaces:
            have = ", ".join(sorted(facts.interfaces)) or "none with an address"
            rep.add("error", "specdeploy_dist_interface", f"interface {rank.interface} does not exist or has no "
                    f"address on the host (interfaces: {have}); NCCL and Gloo would fail to start",
                    "name one of the host's interfaces", host)
        elif _is_ip(rank.address) and rank.address.strip("[]") not in facts.interfaces[rank.interface]:
            rep.add("error", "specdeploy_dist_address", f"{rank.address}, where the other ranks reach this host, is "
                    f"not an address of {rank.interface} ({', '.join(facts.interfaces[rank.interface])})",
                    "set specdeploy_dist_address to the address of specdeploy_dist_interface", host)
    if cross and facts.listening is not None:
        ports = [(rank.port, "specdeploy_dist_port")] if rank.multi_host and rank.leader else []
        if rank.layout == "pd" and rank.role == "prefill":
            ports.append((rank.pd_port, "specdeploy_pd_port"))
        for port, var in ports:
            if port in facts.listening:
                rep.add("warning", var, f"port {port} is already listened on (the engine of an earlier release, or "
                        "another service): the group's engine needs it", f"free it, or give {var} another port",
                        host)
    reach = getattr(facts, "reach", None)
    if rank.multi_host and not rank.leader and reach:
        where = f"the leader {rank.hosts[0]} at {rank.leader_address}:{rank.port}"
        if reach.get("tcp") in ("timeout", "unreachable"):
            why = (f"no answer within {REACH_TIMEOUT_S} s (a firewall drops the packets, or the host is down)"
                   if reach["tcp"] == "timeout" else "no route to it")
            rep.add("error", "specdeploy_dist_port", f"this rank cannot reach {where}: {why}; the group's "
                    "rendezvous would hang until its timeout", "open the rendezvous port between the group's hosts "
                    "(and the engine's other ports above it), or fix the route", host)
        if rank.interface and reach.get("dev") and reach["dev"] != rank.interface:
            rep.add("warning", "specdeploy_dist_interface", f"the route to {where} leaves by {reach['dev']}, while "
                    f"NCCL and Gloo are told to use {rank.interface}", "name the interface the ranks reach each "
                    "other by, or set specdeploy_dist_address to an address on the named interface", host)
    if cross and facts.ntp_synced is False:
        rep.add("warning", "clock", "the clock is not NTP-synchronised (timedatectl): the group's logs and "
                "timeouts disagree between hosts", "enable systemd-timesyncd or chrony", host)
