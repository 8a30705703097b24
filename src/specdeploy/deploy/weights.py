"""What a deploy restarts when the engine attaches to a weight-cache daemon, decided here and unit-tested; the
inference_engine role asks through filters. The daemon restarts (a full load of the checkpoint) only for new
weights: its key (a digest of the unit, env and command line it runs: the checkpoint path, quantization and dtype
flags, the layout and ranks, the release) differs from the key of the running daemon, the staged checkpoint was
switched under the same path, or no daemon runs. Everything else (the gate's two runs, a regate, a canary, k or
load bands, engine flags, a crash) restarts only the engine, which maps the weights again. Without a daemon every
engine restart is a full load, said as such."""
from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping

from specdeploy.deploy.decisions import any_mate, truthy
from specdeploy.deploy.inventory import plain

ACTIVE = ("active", "activating", "reloading")


def restarts(plan: Mapping, engine_changes, daemon_state: str = "", running_key: str = "",
             weights_switched=False) -> dict:
    """For one host: ``{"daemon", "engine", "full_load", "text"}``. ``engine_changes``: the engine restarts anyway
    (a new release, a stale unit); ``daemon_state``: the daemon unit's ActiveState; ``running_key``: the key the
    running daemon was started with (empty when none was recorded); ``weights_switched``: the checkpoint at the
    model path was replaced by a staged copy."""
    plan = plain(plan)
    wc = plan.get("weight_cache")
    engine = truthy(engine_changes) or truthy(weights_switched)
    if not wc:
        why = plan.get("weight_cache_why") or "no weight-cache daemon"
        return {"daemon": False, "engine": engine, "full_load": engine,
                "text": ("the engine restarts: a full load from disk" if engine else "nothing restarts")
                + f" ({why})"}
    reasons = []
    if str(daemon_state or "").strip() not in ACTIVE:
        reasons.append(f"no daemon runs ({daemon_state or 'never started'})")
    elif not running_key:
        reasons.append("the running daemon's weights are not recorded")
    elif running_key.strip() != wc.get("key"):
        reasons.append("new weights, quantization, layout or release (its key changed)")
    if truthy(weights_switched):
        reasons.append("a new checkpoint was switched in at the model path")
    if reasons:
        return {"daemon": True, "engine": True, "full_load": True,
                "text": f"the weight-cache daemon {wc.get('unit')} restarts, a full load, then the engine attaches: "
                        + "; ".join(reasons)}
    if engine:
        return {"daemon": False, "engine": True, "full_load": False,
                "text": f"only the engine restarts and attaches to {wc.get('unit')}, which keeps its weights"}
    return {"daemon": False, "engine": False, "full_load": False, "text": "nothing restarts"}


def group_daemon_restart(mates: Iterable[str], hostvars: Mapping) -> bool:
    """The daemons of a serving group form one rendezvous across its hosts: when one restarts, all do (a rank that
    has not decided counts as restarting)."""
    return any_mate(list(mates), hostvars, "inference_engine_daemon_restart_self", True)


def rollback_restarts(target_plan: Mapping, daemon_state: str = "", running_key: str = "",
                      last_load_s=None) -> dict:
    """Going back to a stored release: ``{"daemon", "stop_daemon", "text"}``. A release whose weights another
    daemon holds restarts it first (a full load, with what the last full load here took); a release without a
    daemon stops the running one first (its copy of the weights would not fit beside the engine's own load)."""
    target_plan = plain(target_plan)
    wc = target_plan.get("weight_cache")
    running = str(daemon_state or "").strip() in ACTIVE
    if not wc:
        return {"daemon": False, "stop_daemon": running,
                "text": "the release loads from disk (a full load)"
                + ("; the running weight-cache daemon stops first to free its GPU memory" if running else "")}
    if running and running_key.strip() == wc.get("key"):
        return {"daemon": False, "stop_daemon": False,
                "text": f"the release's engine attaches to the running {wc.get('unit')}, which holds its weights"}
    cost = f" (the last full load here took {_duration(last_load_s)})" if _seconds(last_load_s) else ""
    return {"daemon": True, "stop_daemon": False,
            "text": f"the release holds other weights than the running daemon: {wc.get('unit')} restarts first, a "
                    f"full load{cost}, then the engine attaches"}


def _seconds(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f > 0 else None


def _duration(v) -> str:
    s = int(_seconds(v) or 0)
    return f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"


MAX_JOURNAL = 4 << 20  # the tail of a journal read for the record (lines are matched, never held whole beyond it)


def record(engine: str, plan: Mapping, daemon_ready=None, engine_ready=None, daemon_journal: str = "",
           engine_journal: str = "", previous=None, now: float | None = None) -> dict:
    """What the exporter publishes about the weight cache (written next to the daemon's key after a deploy): the
    daemon's last full load (seconds, the GPU memory each rank holds where its log says so), the engine's last
    start (seconds to ready, whether it attached or the release fell back to a disk load). ``*_ready``: the
    ``specdeploy ready --json`` outcomes (None: that unit did not restart now: the previous record's figures stay)."""
    from specdeploy.engines import get
    plan = plain(plan)
    prev = plain(previous) if isinstance(previous, Mapping) else {}
    log = get(engine).load_log
    out = {"engine_name": engine, "unit": (plan.get("weight_cache") or {}).get("unit"),
           "key": (plan.get("weight_cache") or {}).get("key"), "daemon": dict(prev.get("daemon") or {}),
           "engine": dict(prev.get("engine") or {}), "time": now if now is not None else time.time()}
    d = plain(daemon_ready) if isinstance(daemon_ready, Mapping) else None
    if d and d.get("status") == "ready":
        mem = [float(m.group(1)) for m in re.finditer(log.daemon_memory, daemon_journal[-MAX_JOURNAL:])] \
            if log.daemon_memory is not None else []
        out["daemon"] = {"load_s": round(float(d.get("elapsed_s") or 0), 1), "since": out["time"],
                         "memory_gib_per_rank": max(mem) if mem else None,
                         "memory_source": "the daemon's log" if mem else None}
    e = plain(engine_ready) if isinstance(engine_ready, Mapping) else None
    if e and e.get("status") == "ready":
        text = engine_journal[-MAX_JOURNAL:]
        attached = bool(log.attached is not None and log.attached.search(text))
        fell_back = bool(log.disk_fallback is not None and log.disk_fallback.search(text))
        out["engine"] = {"ready_s": round(float(e.get("elapsed_s") or 0), 1), "since": out["time"],
                         "attached": attached and not fell_back, "disk_fallback": fell_back}
    return out


def weight_cache_root(plan: Mapping, daemon_status=None, daemon_triage=None, engine_triage=None) -> dict:
    """The failure a deploy reports: the engine's own (``engine_triage``), unless the plan attaches the engine to a
    weight-cache daemon that is not active (``daemon_status``: its unit's ActiveState, Result, ExecMainCode and
    ExecMainStatus): then the daemon's, read from its journal (``daemon_triage``), named as the daemon's."""
    plan = plain(plan)
    wc = plan.get("weight_cache") or {}
    status = plain(daemon_status) if isinstance(daemon_status, Mapping) else {}
    engine_t = plain(engine_triage) if isinstance(engine_triage, Mapping) else {}
    if not wc or str(status.get("ActiveState", "")) in ACTIVE:
        return engine_t
    t = plain(daemon_triage) if isinstance(daemon_triage, Mapping) else {}
    how = ", ".join(f"{k}={status[k]}" for k in ("Result", "ExecMainCode", "ExecMainStatus") if status.get(k))
    state = f"{status.get('ActiveState') or 'not running'}" + (f" ({how})" if how else "")
    cause = t.get("root_cause") or "its log names no cause"
    fix = t.get("fix") or (f"`journalctl -u {wc.get('unit')}` says why it ended; starting the engine starts the daemon "
                           "first (a full load), as does the next deploy")
    return {**t, "root_cause": f"the weight-cache daemon {wc.get('unit')} is {state}, and the engine bound to it "
                               f"cannot serve: {cause}", "fix": fix, "unit": wc.get("unit")}


def page_cache_text(stdout: str) -> str:
    """The page-cache warm's answer (hostscripts/pagecache.py) in a line for the deploy's output."""
    import json
    try:
        d = json.loads(str(stdout or "").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"no answer ({str(stdout)[:200]!r})"
    if not isinstance(d, dict):
        return "no answer"
    if d.get("error"):
        return f"not warmed: {d['error']}"
    gib = 1 << 30
    size, avail = d.get("bytes", 0) / gib, d.get("available", 0) / gib
    if not d.get("fits"):
        return (f"not warmed: the checkpoint ({size:.1f} GiB) and a margin of {d.get('margin', 0) / gib:.0f} GiB do "
                f"not fit in the host's available memory ({avail:.1f} GiB); the engine's load reads the disk")
    if "read_bytes" not in d:
        return f"fits ({size:.1f} GiB of {avail:.1f} GiB available)"
    done = "" if d.get("complete") else " (stopped at its time limit)"
    return (f"warmed {d['read_bytes'] / gib:.1f} GiB of {size:.1f} GiB in {d.get('seconds')} s "
            f"({d.get('mb_per_s')} MB/s){done}: the engine's load reads memory")


def attach_text(rec: Mapping) -> str:
    """A record (``record``) in a line: "attached in N s (the daemon loaded in M min)" or the disk fallback."""
    rec = plain(rec) if isinstance(rec, Mapping) else {}
    e, d = rec.get("engine") or {}, rec.get("daemon") or {}
    loaded = f"the daemon's last full load took {_duration(d.get('load_s'))}" if _seconds(d.get("load_s")) else \
        "the daemon's load is not recorded"
    mem = f", {d['memory_gib_per_rank']:g} GiB per GPU" if d.get("memory_gib_per_rank") else ""
    if e.get("disk_fallback"):
        return f"the engine fell back to a disk load (the release does so without its daemon): ready in " \
               f"{_duration(e.get('ready_s'))}; {loaded}{mem}"
    if e.get("attached"):
        return f"attached in {_duration(e.get('ready_s'))}; {loaded}{mem}"
    return f"ready in {_duration(e.get('ready_s'))}, no attach seen in its log; {loaded}{mem}"


def gate_baseline_overrides(variables, host, hostvars=None, hosts=None) -> dict:
    """The speculation gate's baseline run (no speculation) keeps the weight cache of the speculative release it is
    measured against: where that release has none (SGLang refuses it with speculation), the baseline loads from
    disk too, instead of loading a daemon the speculative run would stop again."""
    from specdeploy.deploy.release import specdeploy_plan
    out = {"specdeploy_spec_enabled": False}
    if not specdeploy_plan(variables, host, None, hostvars, hosts).get("weight_cache"):
        out["specdeploy_weight_cache"] = "off"
    return out


FILTERS = {
    "specdeploy_gate_baseline_overrides": gate_baseline_overrides,
    "specdeploy_attach_text": attach_text,
    "specdeploy_weight_cache_root": weight_cache_root,
    "specdeploy_page_cache_text": page_cache_text,
    "specdeploy_restarts": restarts,
    "specdeploy_group_daemon_restart": group_daemon_restart,
    "specdeploy_rollback_restarts": rollback_restarts,
    "specdeploy_weight_cache_record": record,
}
