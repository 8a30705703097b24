"""How the engine ended, read from the sequence of events rather than from single markers.

- The root is the earliest strong causal evidence, whatever its kind (evidence.py): an exception, a native abort, a
  device error, an NCCL/HCCL warning, a kill; a weak one (a typeless ERROR line, an exception only mentioned at INFO)
  only when no strong one is anywhere in the run, so a later traceback outranks an earlier "ERROR: x failed". Engine
  wrappers are the answer only when nothing else is there; noise (teardown, fallback notices) never is, and when only
  noise is left the answer says the cause is not in the log and what to capture. An NCCL warning that a later NCCL
  exception or watchdog explains supports that one instead of replacing it.
- A stop requested before the first failure makes the failures after it consequences: ``clean-shutdown``. When the
  stop came during the load, the orchestrator's start timeout may be what sent it, and the answer says so.
- A failure followed by routine shutdown lines (uvicorn's ``Application shutdown complete``) is ``failed``; routine
  lines alone say the engine exited, not why.
- An abort or crash after a failure (a watchdog timeout, a GPU fault, then SIGABRT) is that failure, not the abort.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from specdeploy.triage.evidence import UNWRAP, VANISHED, Evidence, collect, shutdown_exception, shutdowns
from specdeploy.triage.normalise import Record
from specdeploy.triage.signatures import HIGH, MEDIUM, hint, signature, timeout_signature

SIGNALS = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
           11: "SIGSEGV", 15: "SIGTERM"}
ENGINE_PROC = re.compile(r"\((?:python[\d.]*|pt_main_thread|[Vv][Ll][Ll][Mm][^)]*|sglang[^)]*|ray::[^)]*)\)")
# A load under way, and an engine that serves: what any engine's log shows (the Hugging Face hub, torch, uvicorn,
# specdeploy's own unit), and each engine's own lines from its adapter (LoadLog.starting and .serving).
_LOADING_ANY = (r"Loading (?:weights|safetensors|model|checkpoint)|torch\.compile|Downloading|Fetching \d+ files|"
                r"Started specdeploy|Loading drafter")
_READY_ANY = r"Application startup complete|Uvicorn running on|ready to serve"


def _with_engines(generic: str, field: str, flags: int = 0):
    from specdeploy.engines import adapters
    own = [getattr(a.load_log, field) for a in adapters() if getattr(a.load_log, field)]
    return re.compile("|".join([generic, *own]), flags)


LOADING = _with_engines(_LOADING_ANY, "starting", re.IGNORECASE)
READY = _with_engines(_READY_ANY, "serving")
START_TIMEOUT = ("It was stopped while the model was still loading: if no one stopped it, the orchestrator's start "
                 "timeout did (systemd TimeoutStartSec = specdeploy_start_timeout, a Kubernetes startupProbe, a "
                 "platform's load timeout); give the load more time.")
NOT_IN_LOG = ("The cause is not in this log. Capture the complete output from the start of the load, every process "
              "included (journalctl -u UNIT --no-pager; kubectl logs POD --all-containers --previous; docker logs "
              "CONTAINER), the kernel log for OOM kills (journalctl -k), and the orchestrator's events (systemctl "
              "status, kubectl describe pod).")
PROBE_FIX = ("Kubernetes restarted the container because a probe failed: during the load, raise the startupProbe "
             "(failureThreshold x periodSeconds above the load time); once serving, the engine stopped answering "
             "/health: the lines before the restart say why.")
SCHEDULER = {
    "TIME LIMIT": ("scheduler-time-limit", "The scheduler ended the job at its time limit: ask for more time "
                   "(sbatch --time / the partition's limit) for the load plus the serving window, or requeue it."),
    "PREEMPTION": ("scheduler-preempted", "A higher-priority job preempted this one: use a partition or QOS "
                   "without preemption, or let it requeue (--requeue)."),
    "NODE FAILURE": ("scheduler-node-failure", "The scheduler lost the node: check the node's health (sinfo -R, its "
                     "kernel log) and resubmit on another node."),
}
OOM_KILLER_FIX = ("The kernel's OOM killer ended the engine: host RAM (or the container's memory limit), not GPU "
                  "memory, ran out (loading shards, pinned memory, CPU offload, many workers). Give the host or "
                  "container more memory, lower CPU-side buffers (--swap-space, CPU offload), or load fewer shards "
                  "in parallel.")


@dataclass
class Triage:
    outcome: str                 # failed | clean-shutdown | killed | no-exception-found
    root_cause: str | None
    location: str | None
    worker: str | None
    signature: str | None
    fix: str | None
    confidence: str | None = None     # high | medium | None
    rank: int | None = None
    timestamp: str | None = None
    evidence: list[dict] = field(default_factory=list)
    next_step: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _explains_warning(warn: Evidence, o: Evidence, text: str) -> bool:
    net = "HCCL" if "HCCL" in warn.text else "NCCL"
    return o.label in ("watchdog", "timeout") or (o.kind == "exception" and net in text)


# evidence that a later piece of evidence explains: the later one is the root, this one supports it
EXPLAINED = {
    "nccl-warn": _explains_warning,                                        # NCCL's warning, then its exception
    "remote-code": lambda e, o, t: o.kind == "exception" and t.startswith("EOFError"),   # the prompt, then EOF
}


def _ev(rec: Record, why: str) -> dict:
    return {"line": rec.n, "text": rec.raw.strip()[:500], "why": why}


def _detail(e: Evidence, text: str) -> str:
    """pydantic puts the message of a ValidationError on the lines after it ("  Value error, ...")."""
    if re.search(r"\d+ validation errors? for \w+", text):
        detail = [b for b in e.block if not b.startswith(("For further information", "http"))][:2]
        if detail:
            return f"{text}: {' '.join(detail)}"[:2000]
    return text


def _unwrap(e: Evidence) -> str | None:
    """``Worker failed with error '<msg>'``: the worker's message, which may span lines."""
    whole = "\n".join([e.text] + e.block)
    m = UNWRAP.search(whole)
    return m.group("msg").strip().splitlines()[0].strip() if m else None


def _during_load(recs: list[Record], upto: int) -> bool:
    seen_load = False
    for r in recs[:upto]:
        if READY.search(r.text):
            return False
        seen_load = seen_load or bool(LOADING.search(r.text))
    return seen_load


def _index(recs: list[Record], rec: Record) -> int:
    return next((i for i, r in enumerate(recs) if r is rec), len(recs))


def decide(recs: list[Record], kernel) -> Triage:
    evs = collect(recs)
    requests, routine = shutdowns(recs)
    shut_excs = [e for e in evs if e.kind == "exception" and shutdown_exception(e.text)]
    causal: list[tuple[Evidence, str]] = []
    wrappers: list[Evidence] = []
    noise: list[Evidence] = []
    for e in evs:
        if e in shut_excs:
            continue
        if e.noise:
            noise.append(e)
            continue
        msg = _unwrap(e) if e.kind == "exception" else None
        if msg:
            causal.append((e, msg))
        elif e.generic:
            wrappers.append(e)
        else:
            causal.append((e, "ValueError: " + e.text if e.label == "pydantic" else _detail(e, e.text)))
    supporting: list[Evidence] = []
    for e, text in list(causal):
        if e.label in EXPLAINED and any(o.order > e.order and EXPLAINED[e.label](e, o, t) for o, t in causal):
            causal.remove((e, text))
            supporting.append(e)
    # the root is the first strong evidence; a typeless error line or a mere mention only when nothing stronger is
    # anywhere in the run (a later traceback outranks an earlier "ERROR: something failed")
    causal = [c for c in causal if not c[0].weak] + [c for c in causal if c[0].weak]
    kernel_kills = [ln.strip() for ln in (kernel or []) if re.search(r"Out of memory: Killed process|oom-kill:", ln)
                    and ENGINE_PROC.search(ln)]
    first_request = requests[0] if requests else (shut_excs[0].rec if shut_excs else None)
    if causal:
        e, text = causal[0]
        if first_request is not None and e.kind != "kill" and _index(recs, first_request) < _index(recs, e.rec):
            return _clean(recs, first_request, "a stop was requested before anything failed; what failed after it "
                                               "was the stop's consequence")
        if e.kind == "kill":
            return _killed(recs, e, kernel_kills, requests)
        return _failed(e, text, supporting)
    if kernel_kills:
        return Triage("killed", kernel_kills[-1], None, None, "host-oom-killer", OOM_KILLER_FIX, HIGH,
                      evidence=[{"line": None, "text": k[:500], "why": "kernel log"} for k in kernel_kills[-3:]])
    if wrappers and (first_request is None or _index(recs, first_request) > _index(recs, wrappers[0].rec)):
        e = ([w for w in wrappers if w.kind == "exception"] or wrappers)[-1]
        nxt = ("Only the engine's wrapper was logged, not the failing worker's exception: read the complete log from "
               "the start of the load (journalctl -u UNIT, or every worker's output) and raise the level "
               "(VLLM_LOGGING_LEVEL=DEBUG / --log-level debug).")
        return Triage("failed", e.text, e.location, e.rec.proc, None, "unknown failure: " + nxt, None, e.rec.rank,
                      e.rec.ts, [_ev(e.rec, "only the engine's generic wrapper was logged")], nxt)
    if first_request is not None:
        return _clean(recs, first_request, "shutdown requested")
    if routine:
        r = routine[0]
        return Triage("no-exception-found", None, None, r.proc, None, None, None, r.rank, r.ts,
                      [_ev(r, "a routine shutdown line, with no failure and no stop request before it")],
                      "The engine shut down without saying why: no failure and no stop request in these lines. Read "
                      "the lines before the shutdown, and the orchestrator's events (systemctl status, kubectl "
                      "describe pod) for who stopped it.")
    if noise:
        return Triage("no-exception-found", None, None, None, None, None, None, evidence=[
            _ev(e.rec, "teardown or a notice, not a cause") for e in noise[:3]], next_step=(
            "Only teardown noise or harmless notices are in these lines (an exception printed while the interpreter "
            "exited, a fallback taken, a readiness poll). " + NOT_IN_LOG))
    return Triage("no-exception-found", None, None, None, None, None, None, next_step=(
        "No exception, no kill and no shutdown in these lines: the log may be cut before the failure, or the engine "
        "hung (for a hang, py-spy dump the workers). " + NOT_IN_LOG))


def _clean(recs: list[Record], r: Record, why: str) -> Triage:
    nxt = "The engine was asked to stop (SIGTERM/SIGINT) and shut down; nothing failed."
    if _during_load(recs, _index(recs, r)):
        nxt += " " + START_TIMEOUT
    return Triage("clean-shutdown", None, None, r.proc, None, None, None, r.rank, r.ts, [_ev(r, why)], nxt)


def _failed(e: Evidence, text: str, supporting: list[Evidence]) -> Triage:
    sig = timeout_signature(e) if e.label == "timeout" else signature(e, text)
    why = {"watchdog": "the exception the NCCL watchdog caught", "pydantic": "the validation error's message",
           "remote-code": "the loader asked to run the model's own code", "nccl-warn": "NCCL's own warning",
           "timeout": "the first collective timeout", "panic": "a component written in Rust panicked",
           "embedded": "the exception inside the message", "shell": "the launch script's own error"}.get(e.label) or {
        "exception": "root exception", "error-line": "root error line, no exception type",
        "device": "the device's own error", "native": "native code aborted"}.get(e.kind, "root cause")
    evidence = [_ev(e.rec, why)]
    name = conf = fix = nxt = None
    if sig:
        name, conf, fix, rec, swhy = sig
        if rec is not e.rec:
            evidence.append(_ev(rec, swhy))
    else:
        nxt = hint(text) or (
            f"No known signature: search the engine's issues for this exception verbatim; the innermost frame is "
            f"{e.location}." if e.location else
            "No known signature: search the engine's issues for this message verbatim and read the lines just "
            "before it in the same process.")
        fix = "unknown failure: " + nxt
    evidence += [_ev(s.rec, "NCCL's own warning" if s.label == "nccl-warn" else "what led to it")
                 for s in supporting[:3]]
    return Triage("failed", text, e.location, e.rec.proc, name, fix, conf, e.rec.rank, e.rec.ts, evidence, nxt)


def _scheduler_kill(e: Evidence, text: str, ev: list[dict]) -> Triage:
    ev[0]["why"] = "the scheduler's own line"
    name, fix = next((v for k, v in SCHEDULER.items() if k in e.text), SCHEDULER["NODE FAILURE"])
    return Triage("killed", text, None, e.rec.proc, name, fix, HIGH, e.rec.rank, e.rec.ts, ev)


def _killed(recs: list[Record], e: Evidence, kernel_kills: list[str], requests: list[Record]) -> Triage:
    sig_no = None
    m = re.search(r"exit code:? (-?\d+)|status=(\d+)/|exited with (?:exit )?code:? (-?\d+)", e.text)
    if m:
        code = int(next(g for g in m.groups() if g is not None))
        sig_no = -code if code < 0 else (code - 128 if code > 128 else (code if "status=" in e.text else None))
    for word, no in (("Segmentation fault", 11), ("Aborted", 6), ("Bus error", 7), ("OOMKilled", 9),
                     *((nm, no) for no, nm in SIGNALS.items())):
        if word in e.text:
            sig_no = no
    name = SIGNALS.get(sig_no or 0)
    text = e.text + (f" ({name})" if name and name not in e.text else "")
    ev = [_ev(e.rec, "the process ended by a signal, without a Python traceback")]
    t = (e.rec.proc, e.rec.rank, e.rec.ts)
    loading = _during_load(recs, _index(recs, e.rec))
    if name in ("SIGTERM", "SIGINT") and requests:
        nxt = "The engine was asked to stop and was stopped by a signal; nothing failed."
        return Triage("clean-shutdown", None, None, t[0], None, None, None, t[1], t[2], ev,
                      nxt + (" " + START_TIMEOUT if loading else ""))
    if "start operation timed out" in e.text:
        return Triage("killed", text, None, t[0], "systemd-start-timeout",
                      "systemd stopped the engine because the model load took longer than the unit's start timeout: "
                      "raise specdeploy_start_timeout (a trillion-parameter load takes tens of minutes).", HIGH,
                      t[1], t[2], ev)
    if e.label == "scheduler":
        return _scheduler_kill(e, text, ev)
    if e.label == "probe":
        ev[0]["why"] = "the orchestrator's probe failed and it restarted the container"
        fix = PROBE_FIX + (" " + START_TIMEOUT if loading else "")
        return Triage("killed", text, None, t[0], "k8s-probe-restart", fix, MEDIUM, t[1], t[2], ev)
    if name == "SIGTERM" and loading:
        return Triage("killed", text, None, t[0], "start-timeout-likely", START_TIMEOUT, MEDIUM, t[1], t[2], ev)
    if m and sig_no is None and "exit" in e.text:
        nxt = ("The process exited with an error code and no traceback in these lines: read the lines just before "
               "it, and the complete log of that process.")
        return Triage("failed", text, None, t[0], None, "unknown failure: " + nxt, None, t[1], t[2], ev, nxt)
    oom_line = e.label == "oom-killer" or "OOMKilled" in e.text
    if oom_line or (kernel_kills and name in ("SIGKILL", None)):
        ev[0]["why"] = "the OOM killer's own line" if oom_line else ev[0]["why"]
        ev += [{"line": None, "text": k[:500], "why": "kernel log"} for k in kernel_kills[-3:]]
        return Triage("killed", text, None, t[0], "host-oom-killer", OOM_KILLER_FIX, HIGH, t[1], t[2], ev)
    if VANISHED.search(e.text):
        ev[0]["why"] = "a process went away without a traceback of its own; the others only saw it go"
    nxt = ("The process was killed without a traceback. If it was SIGKILL, check the kernel log for the OOM killer: "
           "`specdeploy triage --journal UNIT` (reads journalctl -k) or `journalctl -k | grep -i 'killed process'`; "
           "SIGABRT/SIGSEGV come from native code: look at the lines just before it.")
    return Triage("killed", text, None, t[0], None, "unknown: " + nxt, None, t[1], t[2], ev, nxt)
