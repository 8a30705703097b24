"""The fleet's status: each exporter and Prometheus read at once, each an untrusted peer with its own deadline."""
from __future__ import annotations

import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from specdeploy.speculation import metrics as M
from specdeploy.ops.fleet import Target


# Every exporter and Prometheus is an untrusted peer: each request has its own total deadline and size cap
# (peerhttp), all of them run at once, and a host that answers garbage is one bad row, never a dead command.
def scrape_exporter(t: Target, timeout: float = 2.0) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    from specdeploy.values.peerhttp import PeerError, text
    row: dict[str, Any] = {"host": t.host, "address": t.address, "reachable": False}
    from specdeploy.values.peerhttp import host_port
    where = f"exporter {host_port(t.address, t.exporter_port)}"
    try:
        page = text(f"http://{host_port(t.address, t.exporter_port)}/metrics", timeout)
    except PeerError as exc:
        row["reachable"] = exc.reason.startswith(("HTTP ", "an HTML", "binary", "not UTF-8", "answer"))
        row["error"] = f"{where}: {exc.reason}"
        return row
    row["reachable"] = True
    seen: dict[str, Any] = {}
    try:
        for fam in text_string_to_metric_families(page):
            for s in fam.samples:
                if s.name == "specdeploy_engine_up":
                    seen["up"] = bool(s.value)
                elif s.name == "specdeploy_engine_info":
                    seen.update(engine=s.labels.get("engine"), version=s.labels.get("version"),
                                release=s.labels.get("release") or None,
                                speculation="on" if s.labels.get("spec_tokens") not in ("0", "", None) else "off",
                                spec_tokens=s.labels.get("spec_tokens"))
                elif s.name == "specdeploy_spec_acceptance_length":
                    seen["acceptance_length"] = s.value
                elif s.name == "specdeploy_spec_acceptance_rate":
                    seen["acceptance_rate"] = s.value
                elif s.name == "specdeploy_gate_verdict" and s.value == 1:
                    seen["gate"] = s.labels.get("verdict")
                elif s.name == "specdeploy_group_rank_joined" and s.labels.get("rank_host"):
                    seen.setdefault("group_joined", {})[s.labels["rank_host"]] = bool(s.value)
                elif s.name in WEIGHT_CACHE_FIELDS:  # the weight-cache daemon the engine attaches to
                    wc = seen.setdefault("weight_cache", {})
                    wc[WEIGHT_CACHE_FIELDS[s.name]] = bool(s.value) if s.name.endswith("_up") else s.value
                    if s.name == "specdeploy_engine_start_seconds":
                        wc["start_how"] = s.labels.get("how")
    except Exception as exc:  # noqa: BLE001 - the parser raises bare ValueErrors and more on garbage
        row["error"] = f"{where}: not a metrics page ({str(exc).splitlines()[0][:60] if str(exc) else 'garbage'})"
        return row
    if "up" not in seen:
        row["error"] = f"{where}: no specdeploy_engine_up (not a specdeploy exporter?)"
        return row
    row.update(seen)
    return row


# the exporter's weight-cache figures (speculation/weightcache.py) -> the row's weight_cache keys
WEIGHT_CACHE_FIELDS = {"specdeploy_weight_cache_up": "up", "specdeploy_weight_cache_memory_bytes": "memory_bytes",
                       "specdeploy_weight_cache_load_seconds": "load_s", "specdeploy_engine_start_seconds": "start_s"}


def weight_cache_text(wc: dict | None) -> str:
    """A row's weight cache in a few words: "up, 70.1 GiB/GPU, loaded in 30 min, attached in 42 s"."""
    if not wc:
        return "-"
    parts = ["up" if wc.get("up") else "DOWN"]
    if wc.get("memory_bytes"):
        parts.append(f"{wc['memory_bytes'] / (1 << 30):.1f} GiB/GPU")
    if wc.get("load_s") is not None:
        s = int(wc["load_s"])
        parts.append(f"loaded in {s // 60} min" if s >= 120 else f"loaded in {s} s")
    if wc.get("start_s") is not None:
        how = {"attached": "attached", "disk": "disk fallback"}.get(wc.get("start_how") or "", "started")
        parts.append(f"{how} in {int(wc['start_s'])} s")
    return ", ".join(parts)


PROM_QUERIES = {"tokens_per_s": M.q_tokens_per_s("1m"), "ttft_p50": M.q_ttft(0.5, "5m"),
                "ttft_p99": M.q_ttft(0.99, "5m"), "restarts": M.Q_RESTARTS}


def prom_query(base: str, q: str, timeout: float = 3.0) -> dict[str, float]:
    """Instant query -> {host: value} (NaN results dropped); a PeerError for anything but a vector answer."""
    from specdeploy.values.peerhttp import PeerError, json_object
    url = f"{base.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    data = json_object(url, timeout)
    result = (data.get("data") or {}).get("result") if isinstance(data.get("data"), dict) else None
    if data.get("status") != "success" or not isinstance(result, list):
        raise PeerError(url, f"not a Prometheus query answer ({str(data.get('error') or 'no result')[:60]})")
    out = {}
    for r in result:
        try:
            v = float(r["value"][1])
            host = r["metric"].get("host", "")
        except (TypeError, KeyError, IndexError, ValueError, AttributeError):
            raise PeerError(url, "a malformed sample in the Prometheus answer") from None
        if v == v:
            out[str(host)] = v
    return out


CONCURRENCY = 128  # requests in flight at once (exporters and Prometheus queries)


def fleet_status(hosts: list[Target], prometheus: list[str], timeout: float = 2.0,
                 concurrency: int = CONCURRENCY, deadline: float | None = None) -> dict:
    """One row per host from its exporter, with serving figures from Prometheus. At most ``concurrency`` requests
    are in flight, each with its own ``timeout`` as a total deadline; the whole call answers for every host
    within ``deadline`` (default: enough for the queue to drain when every peer uses its whole timeout, so a
    small fleet takes about ``timeout``): a host still queued when it passes is reported as not asked, never
    waited for. A rank that joins a serving group's leader has no exporter: its row is its group's, read from the
    leader's, with whether the leader sees it joined (``joined``, topology/links): a rank that went away is down,
    and so is its group, though the leader's engine answers its health check until its next request fails."""
    from concurrent.futures import wait
    scraped = [t for t in hosts if t.leader in (None, t.host)]
    jobs = len(scraped) + len(prometheus) * len(PROM_QUERIES)
    width = max(1, min(int(concurrency), jobs))
    if deadline is None:
        deadline = timeout * -(-jobs // width) + 1.0
    end = time.monotonic() + deadline
    ex = ThreadPoolExecutor(max_workers=width, thread_name_prefix="status")

    def bounded(fn, *args):
        left = end - time.monotonic()
        if left <= 0.05:
            raise TimeoutError(f"not asked: the status deadline ({deadline:g} s) passed first; raise --deadline "
                               "or --concurrency")
        return fn(*args, min(timeout, left))
    try:
        # Prometheus first: its few queries must not wait behind a thousand exporters
        prom_f = {base: {k: ex.submit(bounded, prom_query, base, q) for k, q in PROM_QUERIES.items()}
                  for base in prometheus}
        rows_f = [ex.submit(bounded, scrape_exporter, t) for t in scraped]
        # each request holds its own deadline; this only guards the whole call against a stuck thread
        wait(rows_f + [f for fs in prom_f.values() for f in fs.values()],
             timeout=max(0.0, end - time.monotonic()) + 0.5)
        rows = []
        for t, f in zip(scraped, rows_f):
            if f.done() and not f.exception():
                rows.append(f.result())
            else:
                why = f"{f.exception()}"[:120] if f.done() else f"no answer within {timeout:g} s"
                rows.append({"host": t.host, "address": t.address, "reachable": False,
                             "error": f"exporter {t.address} port {t.exporter_port}: {why}"})
        prom_used, prom_errors = None, []
        figures: dict[str, dict[str, float]] = {}
        for base, fs in prom_f.items():
            bad = [f"{getattr(f.exception(), 'reason', f.exception())}" if f.done() else
                   f"no answer within {timeout:g} s" for f in fs.values() if not f.done() or f.exception()]
            if bad:
                prom_errors.append(f"{base}: {bad[0]}")
                continue
            figures = {k: f.result() for k, f in fs.items()}
            prom_used = base
            break
    finally:
        ex.shutdown(wait=False, cancel_futures=True)
    for row in rows:
        for k, by_host in figures.items():
            if row["host"] in by_host:
                row[k] = by_host[row["host"]]
    by_host = {r["host"]: r for r in rows}
    out = []
    for t in hosts:
        if t.leader in (None, t.host):
            row = dict(by_host[t.host])  # a copy: its followers read the group's state from the original
        else:
            lead = by_host.get(t.leader)
            if lead is None:  # its leader is outside --limit: nothing to read it from
                row = {"host": t.host, "address": t.address, "reachable": False,
                       "error": f"rank {t.rank} of serving group {t.group}: its leader {t.leader} is not in the "
                                "selection (--limit); the group's state is on the leader's exporter"}
            else:
                row = {k: v for k, v in lead.items() if k in ("reachable", "up", "engine", "version", "release",
                                                                 "speculation", "spec_tokens", "error")}
                row.update(host=t.host, address=t.address, via=t.leader)
                joined = (lead.get("group_joined") or {}).get(t.host)
                if joined is not None:
                    row["joined"] = joined
                if joined is False:
                    row["up"] = False
                    row["group_state"] = "rank lost"
                    row["error"] = (f"rank {t.rank} of serving group {t.group} holds no connection to its leader "
                                    f"{t.leader}'s rendezvous port: it went away, and the group cannot serve (the "
                                    "leader's engine answers its health check until its next request fails)")
        if t.group is not None:
            row.update(group=t.group, rank=t.rank)
            lost = sorted(h for h, ok in (row.get("group_joined") or {}).items() if not ok)
            if lost:
                row["group_state"] = "group broken"
                row["error"] = (f"serving group {t.group} cannot serve: rank(s) {', '.join(lost)} went away (no "
                                "connection to this leader's rendezvous port); the next request fails")
        row.pop("group_joined", None)
        out.append(row)
    return {"time": time.time(), "prometheus": prom_used, "prometheus_errors": prom_errors, "hosts": out}


def prometheus_urls(monitoring: list[str], explicit: str | None) -> list[str]:
    from specdeploy.values.peerhttp import host_port
    return [explicit] if explicit else [f"http://{host_port(m, 9090)}" for m in monitoring]
