"""Evidence: what in a log can say why an engine ended, by kind, each found per process stream.

Kinds (``Evidence.kind``), each with its own rules for when it counts:

- ``exception``: a Python exception line (``Type: message``), with its traceback's frames when it has one and, when
  the exception was logged before its traceback, the frames of the traceback that follows; an exception inside a
  sentence (``embedded``: "Failed to initialize Python stub: TypeError: ..."), strong at ERROR level or when a
  front-end's own stack (``At:``) follows it;
- ``error-line``: an error with no exception type: uvicorn's ``ERROR:    <msg>``, KServe's / vLLM's / glog's
  ERROR-level records ("Failed to start model server: <msg>"), torch's ``what():``, pydantic's ``Value error,``,
  the custom-code prompt, a launch script's shell error. Only records at ERROR level or above count, never a
  traceback's own lines, never the header line of a traceback that follows it (its exception is the evidence);
- ``device``: the GPU/NPU said it: CUDA device-side assertions, CUDA driver errors, ROCm HSA errors, Ascend CANN
  error records (``EJ0003: [PID: n] ...``), torch_npu's ``NPU function error``, CANN's inner errors and device
  exceptions;
- ``native``: native code aborted: a Rust panic (its message is on the next line), an uncaught C++ exception
  (``terminate called ...`` with its ``what()``), a failed CHECK or assert, glibc's heap checks;
- ``collective``: NCCL/HCCL ``WARN`` lines, the NCCL watchdog's caught exception (``watchdog``) and its collective
  timeout (``timeout``), NIXL's error codes;
- ``kill``: a process ended by a signal or an exit code, the OOM killer (kernel, systemd, a container runtime, a
  Slurm cgroup), a scheduler's time limit or preemption, a Kubernetes probe, systemd's start timeout, a worker or
  engine process that went away with no traceback of its own;
- ``shutdown``: a stop was requested (signals, KeyboardInterrupt, ``WorkerProc was terminated``, uvicorn's
  ``Shutting down``, a scheduler's cancel) or a routine shutdown line (``Application shutdown complete``): never a
  failure.

Strength: a typeless ERROR line and an exception only mentioned at INFO/WARNING are ``weak`` (any other evidence is
the root before them); teardown printed while the interpreter exits (``Exception ignored in: ...``), fallback
notices and readiness polls are ``noise`` (never the root). Config and argument dumps are data, never evidence.
Engine wrappers (``Engine core initialization failed``) are evidence of last resort (``generic``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from specdeploy.triage.normalise import Record

EXC = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Timeout|Failure|Fault|"
                 r"Failed)|Exception|StopIteration|KeyError))(?:\([\w.]*\))?(?::\s*(?P<msg>.*))?$")
FRAME = re.compile(r'^\s*File \\?"(?P<file>[^"\\]+)\\?", line (?P<line>\d+)(?:, in (?P<fn>\S+))?|'
                   r"^\s*File (?P<file2>\S+\.py):(?P<line2>\d+), in (?P<fn2>\S+)")
CHAIN = re.compile(r"^(?:The above exception was the direct cause|During handling of the above exception)")
DUMP = re.compile(r"(?i)(?:with config:|args: Namespace\(|server_args=ServerArgs\(|non-default args|vLLM config: \{|"
                  r"\bengine_args\s*[=:(]|EngineArgs\(|Namespace\(|\bconfig=\{)")
GENERIC = (
    "Engine core initialization failed", "EngineDeadError", "WorkerProc initialization failed",
    "RuntimeError: Worker proc", "EngineCore encountered an issue", "Received sigquit from a child",
    "Rank 0 scheduler is dead", "Engine process failed to start", "Worker failed with error",
    "Call to collective_rpc method failed", "AsyncEngineDeadError", "Background loop has errored already",
    "MultiprocExecutor got fatal signal", "MulitprocExecutor got fatal signal", "Exception in worker",
    "See stack trace (above) for the root cause", "Failed core proc(s)", "exceptions.RayTaskError",
    "EngineCore failed to start", "WorkerProc hit an exception", "WorkerProc failed to start",
    "Invocation of collective_rpc method failed", "Error executing method", "Exception in ASGI application",
    "Application startup failed", "call hccl api failed", "UNKNOWN applicaiton exception", "UNKNOWN application",
    "Scheduler hit an exception", "EngineCore hit an exception", "EngineCore encountered a fatal error",
    "raised an exception", "error raised in its creation task", "Exception in Replica", "the replica will be stopped",
    "output_handler failed", "Error in chat completion stream generator", "Failed to start engine",
    "PTA call acl api failed", "Engine loop is not running", "Engine loop has died",
)
SHUTDOWN_EXC = re.compile(r"^(?:KeyboardInterrupt|(?:asyncio\.(?:exceptions\.)?)?CancelledError|SystemExit(?::\s*0)?$)|"
                          r"WorkerProc was terminated")
UNWRAP = re.compile(r"Worker failed with error '(?P<msg>.+?)',? please check the stack trace", re.DOTALL)
# a stop was requested (by an operator, an orchestrator, a signal) / a routine line printed on any exit
SHUTDOWN_REQUEST = re.compile(r"(?i)^Shutting down\.?$|Shutting down FastAPI|\[shutdown\]|"
                              r"received signal=SIG(?:TERM|INT)|"
                              r"Received (?:SIGTERM|SIGINT|signal (?:2|15)\b)|SIG(?:TERM|INT) received|"
                              r"terminated by shutdown signal|^Stopping \S+\.service|Gracefully (?:exiting|stopping)|"
                              r"Received shutdown signal|Caught (?:SIGTERM|SIGINT)|CANCELLED AT \S+ \*\*\*|"
                              r"WorkerProc was terminated|^KeyboardInterrupt")
SHUTDOWN_ROUTINE = re.compile(r"(?i)Waiting for application shutdown|Application shutdown complete|Finished server "
                              r"process|Deactivated successfully|shutdown complete|Stopping specdeploy")
# non-Python lines: (kind, label, pattern); the first that matches a line names it
_KILLS = (r"Worker \S+ pid \d+ died, exit code:? -?\d+|(?:Worker|Engine core) proc \S+ died unexpectedly.*|"
          r"Engine process \(pid \d+\) died|"
          r"The actor is dead because its worker process has died\.?(?: Worker exit type: \w+)?|"
          r"The actor died unexpectedly before finishing this task|code=(?:killed|dumped), status=\d+/\w+|"
          r"exited with (?:exit )?code:? -?\d+|A worker died or was killed while executing a task.*|^Killed\s*$|"
          r"OOMKilled|start operation timed out.*|Fatal Python error: (?:Segmentation fault|Aborted|Bus error)|"
          r"(?:Segmentation fault|Aborted|Bus error) \(core dumped\)|\*\*\* SIG(?:SEGV|ABRT|BUS|ILL|FPE) received.*|"
          r"(?:killed|terminated) by signal:? (?:SIG)?(?:KILL|SEGV|ABRT|BUS|9|11|6|7)\b.*")
_OOM = (r"Out of memory: Killed process \d+ \([^)]*\).*|invoked oom-killer.*|oom-kill:.*|"
        r"A process of this unit has been killed by the OOM killer\.?|Failed with result 'oom-kill'\.?|"
        r"Detected \d+ oom[-_]kill events?.*|task \d+: Out Of Memory|OOMKilling.*")
_HEAP = (r"double free or corruption(?: \(\w+\))?|corrupted double-linked list(?: \([\w ]+\))?|"
         r"corrupted size vs\. prev_size|(?:malloc|free|realloc|malloc_consolidate|munmap_chunk)\(\): [\w ]{3,60}|"
         r"\*\*\* stack smashing detected \*\*\*.*")
LINES = [
    ("collective", "watchdog", re.compile(r"watchdog thread terminated with exception:\s*(?P<msg>(?!\[Rank)"
                                          r"(?!.*Watchdog caught).*?)\s*$", re.IGNORECASE)),
    ("collective", "timeout", re.compile(r"Watchdog caught collective operation timeout: .*")),
    ("kill", "oom-killer", re.compile(_OOM)),
    ("kill", "scheduler", re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+ DUE TO "
                                     r"(?:TIME LIMIT|PREEMPTION|NODE FAILURE).*")),
    ("kill", "probe", re.compile(r"(?:Startup|Liveness) probe failed\b.*|"
                                 r"Container \S+ failed (?:startup|liveness) probe, will be restarted")),
    ("kill", "signal", re.compile(_KILLS)),
    # systemd stops a unit whose BindsTo= unit went away (an engine bound to its weight-cache daemon)
    ("kill", "bound-unit", re.compile(r"(?:Unit \S+ |\S+: Unit )?is bound to inactive unit \S+?\.? Stopping, too\.?|"
                                      r"this engine stopped with its weight-cache daemon \S+, which is \S+ "
                                      r"\(result: [^)]*\)")),
    ("native", "panic", re.compile(r"thread '[^']{0,200}' panicked at .+")),
    ("native", "terminate", re.compile(r"terminate called after throwing an instance of '[^']{1,300}'")),
    ("native", "heap", re.compile(_HEAP)),
    ("native", "check", re.compile(r"(?:Check failed|CHECK failed|CHECK_\w+ failed)[:\s].{0,400}|"
                                   r"Assertion failed: .{3,400}")),
    ("device", "cuda-assert", re.compile(r"\S[^`']{0,300}?Assertion [`'][^\n]{1,400}?['`] failed\.?")),
    ("device", "cuda-driver", re.compile(r"CUDA driver error: .+|CUDA_ERROR_[A-Z_]+.*|Cuda failure '[^']+'.*|"
                                         r"Triton Error \[CUDA\]: .+")),
    ("device", "hsa", re.compile(r"HSA_STATUS_ERROR_\w+.*")),
    ("device", "cann", re.compile(r"^(?P<code>E[A-Z0-9]\d{4}): \[PID: \d+\] (?P<msg>.+)")),
    ("device", "npu-function", re.compile(r"(?:NPU|ACL|ACLNN|HCCL|HIP) function error: .+")),
    ("device", "device-exception", re.compile(r"(?:The error from device\([^)]{0,80}\)[^\[]{0,80}?, )?"
                                              r"there is an exception of (?:[\w\-]+ ){0,3}error")),
    ("device", "cann-inner", re.compile(r"^(?P<msg>[^\[\]]{0,300}?\b(?:fail\w*|error|invalid|not support\w*)\b"
                                        r"[^\[\]]{0,300}?)\s*\[FUNC:\w+\]\[FILE:[\w.\-]+\]\[LINE:\d+\]")),
    ("collective", "nccl-warn", re.compile(r"\b(?:NCCL|HCCL) WARN .+")),
    ("collective", "nixl", re.compile(r"NIXL_ERR_\w+.*")),
    ("error-line", "remote-code", re.compile(r"\S.{0,300}contains custom code which must be executed.*")),
    ("error-line", "pydantic", re.compile(r"^Value error, (?P<msg>.+?)(?: \[type=value_error.*)?$")),
    ("error-line", "unhandled", re.compile(r"Unhandled exception: \S+ what\(\): (?P<msg>.*)|^\s*what\(\):\s+"
                                           r"(?P<msg2>\S.*)")),
    ("error-line", "shell", re.compile(r"^(?:\S+: )?(?:line )?\d+: (?P<msg>[\w./\-]{1,200}: (?:not found|"
                                       r"command not found|Permission denied|No such file or directory))\s*$")),
]
# words one of LINES needs: a line without any is not looked at by them (substring tests, cheaper than a pattern)
HINT_WORDS = ("atchdog", "Kill", "kill", "died", "exit code", "exited", "custom code", "Unhandled exception", "what()",
              "Value error", "timed out", "Segmentation", "Aborted", "Bus error", "Assertion", "CUDA driver",
              "CUDA_ERROR", "HSA_STATUS", "WARN", "[PID", "OOM", "oom", "Out Of Memory", "panicked",
              "terminate called", "corrupt", "double free", "(): ", "stack smashing", "heck failed", "CHECK",
              "CANCELLED AT", "probe", "function error", "exception of", "[FUNC:", "NIXL_ERR", "not found",
              "Permission denied", "No such file", "Cuda failure", "Triton Error", "SIG", "by signal",
              "bound to inactive unit", "weight-cache daemon")


def _hinted(t: str) -> bool:
    return any(w in t for w in HINT_WORDS)
# native evidence whose message goes on the next line: a Rust panic's message, a C++ exception's what()
MERGE_NEXT = {"panic": re.compile(r"^(?P<msg>\S.*)"), "terminate": re.compile(r"^\s*what\(\):\s+(?P<msg>\S.*)")}
# lines that repeat a failure already seen, never evidence of their own
REPEAT = re.compile(r"^terminate called recursively|^Error: task \d+ panicked with message|"
                    r"^note: run with `RUST_BACKTRACE")
# teardown after the failure, printed while the interpreter exits ("Exception ignored in: ... __del__"): never the cause
TEARDOWN = re.compile(r"^(?:Exception ignored in:?|Error in atexit\._run_exitfuncs:|Error in sys\.excepthook:|"
                      r"Exception ignored on (?:calling|threading))")
# an error line that is a harmless notice (a fallback taken, a readiness poll while the engine starts or is gone)
NOTICE = re.compile(r"(?i)\bfall(?:ing|s)?\s?back\b|\bfallback\b|\bwill be disabled\b|\busing (?:the )?default\b|"
                    r"waiting for .{0,60}?(?:ready|to start|to become|to come up)|not ready yet|\bretrying\b|"
                    r"\bwill retry\b|health ?check failed")
# an exception inside a sentence ("Failed to initialize Python stub: TypeError: ...")
EMBEDDED = re.compile(r"(?:^|[\s:(\[\"'])(?P<exc>(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?:\([\w.]*\))?:"
                      r"\s+\S.*)$")
TYPE_END = re.compile(r"(?:Error|Exception)(?:\([\w.]*\))?:\s")
SCAN = 4096           # characters of a line that the evidence patterns look at
# the frames of a front-end's own stack format (Triton's Python backend: "At:" then "  /path/model.py(75): initialize")
FRAME_AT = re.compile(r"^\s*(?:At:|/\S+\.py\(\d+\): \S+)\s*$")
# a process that went away, named inside a wrapper's message
VANISHED = re.compile(r"Engine process \(pid \d+\) died|(?:Worker|Engine core) proc \S+ died unexpectedly|"
                      r"worker process has died|actor died unexpectedly")
SHUT_HINT = re.compile(r"[Ss]hut|SIG|[Ss]ignal|Stopping|Keyboard|terminated|Gracefully|Finished server|Deactivated|"
                       r"CANCELLED")
ERROR_LEVELS = ("ERROR", "CRITICAL", "FATAL")
ERRORISH = re.compile(r"(?i)\b(?:error|errno|failed|failure|cannot|can't|unable|refused|denied|invalid|not found|"
                      r"no such|timed out|out of memory|not supported|unsupported)\b")
# one request refused with a client error (vLLM logs them at ERROR: `Error with model error=ErrorInfo(message='The
# model `x` does not exist. ...', type='NotFoundError', param='model', code=404)`): the engine answered and serves on
REQUEST_ERROR = re.compile(r"ErrorInfo\(.*\bcode=4\d\d\)\s*$")
NOT_A_MESSAGE = re.compile(r"^(?:\s|\^|~|-{3,}|={3,}|Traceback|File )|^\W*$")


@dataclass
class Evidence:
    kind: str              # exception | error-line | device | collective | kill | shutdown
    label: str             # the detector: exception, uvicorn, cann, nccl-warn, watchdog, timeout, signal, ...
    text: str
    rec: Record
    order: int
    location: str | None = None
    frames: list[str] = field(default_factory=list)
    block: list[str] = field(default_factory=list)    # the message's continuation lines
    in_tb: bool = False
    generic: bool = False
    tb_hdr: bool = False   # its traceback's frames were logged as records of their own (each with a header)
    near: list[str] = field(default_factory=list)     # neighbouring lines, for the phase of an OOM only
    after: list[Record] = field(default_factory=list)  # the next records of the same process
    weak: bool = False     # a typeless error line, or an exception only mentioned at INFO/WARNING: any stronger
    #                        evidence, earlier or later, is the root before it
    noise: bool = False    # teardown after the failure or a harmless notice: never the root


def generic(text: str) -> bool:
    return any(g in text for g in GENERIC)


def shutdown_exception(text: str) -> bool:
    return bool(SHUTDOWN_EXC.search(text))


def _frames_after(body, j: int) -> tuple[str | None, list[str]]:
    """The frames of a traceback that starts at body[j] (an exception logged before its traceback)."""
    frames, loc = [], None
    for _, r in body[j + 1:j + 400]:
        fm = FRAME.match(r.text)
        if fm:
            loc = f"{fm.group('file') or fm.group('file2')}:{fm.group('line') or fm.group('line2')}"
            frames.append(f"{fm.group('file') or fm.group('file2')} {fm.group('fn') or fm.group('fn2') or ''}")
        elif EXC.match(r.text.strip()) or CHAIN.match(r.text.strip()):
            break
    return loc, frames[-12:]


def _message(r: Record, t: str) -> bool:
    """A record that is a message of its own: not a traceback's line, not a config dump, not a refused request."""
    return not NOT_A_MESSAGE.search(r.text) and not DUMP.search(t) and not REQUEST_ERROR.search(t)


def _stream(body, out: list[Evidence]) -> None:
    frames: list[str] = []
    last_loc = None
    frames_hdr = False
    cur: Evidence | None = None
    pending: Evidence | None = None      # a logged line whose message continues on the next line
    merge: Evidence | None = None        # native evidence whose message is on the next line
    teardown = False                     # the next exception is printed while the interpreter exits
    for j, (i, r) in enumerate(body):
        t = r.text.strip()
        if not t:
            cur = None
            continue
        if len(t) > SCAN:                    # evidence is in a line's head: the rest is data (bounds the regexes)
            t = t[:SCAN]
        if pending is not None:
            pending.text, pending.rec, pending = t[:2000], r, None
            continue
        if merge is not None:
            m = MERGE_NEXT[merge.label].match(t)
            follow, merge = merge, None
            if m and (follow.label != "panic" or follow.text.endswith(":")):
                sep = " " if follow.label == "panic" else ": what(): "
                follow.text = (follow.text + sep + m.group("msg").strip())[:2000]
                continue
        if REPEAT.match(t):
            continue
        if TEARDOWN.match(t):
            teardown, cur = True, None
            continue
        if t.startswith("Traceback (most recent call last)"):
            prev = out[-1] if out and out[-1].rec.proc == r.proc else None
            if prev is not None and prev.kind == "exception" and prev.rec.hdr and prev.order == body[j - 1][0] and \
                    (not prev.in_tb or not prev.tb_hdr):
                prev.location, prev.frames = _frames_after(body, j)   # logged before its traceback
                prev.in_tb = bool(prev.frames)
            elif prev is not None and prev.kind == "error-line" and prev.label == "logged" and prev.order == \
                    body[j - 1][0] and not prev.generic:
                out.remove(prev)             # the header of this traceback: its exception is the evidence
            frames, last_loc, cur = [], None, None
            continue
        fm = FRAME.match(t)
        if fm:
            f, ln = fm.group("file") or fm.group("file2"), fm.group("line") or fm.group("line2")
            last_loc = f"{f}:{ln}"
            frames_hdr = r.hdr
            frames.append(f"{f} {fm.group('fn') or fm.group('fn2') or ''}")
            cur = None
            continue
        em = EXC.match(t.rstrip('"'))
        if em and not DUMP.search(t):
            t = t.rstrip('"')
            gone = VANISHED.search(t) if generic(t) else None
            if gone:                         # a wrapper that says the process went away: that is the evidence
                cur = Evidence("kill", "signal", gone.group(0), r, i)
            else:
                cur = Evidence("exception", "exception", t, r, i, last_loc, frames[-12:], [], bool(frames), generic(t),
                               tb_hdr=frames_hdr, noise=teardown)
            teardown = False
            out.append(cur)
            frames, last_loc = [], None
            continue
        if CHAIN.match(t):
            cur = None
            continue
        continuation = cur is not None and (not r.hdr or r.text.startswith((" ", "\t")))
        if continuation and len(cur.block) < 8:
            cur.block.append(t)
        found = None
        if _hinted(t) and not DUMP.search(t):
            for kind, label, rx in LINES:
                m = rx.search(t)
                if m:
                    gd = m.groupdict()
                    text = (gd.get("msg") or gd.get("msg2") or m.group(0)).strip()
                    if label == "cann":
                        text = f"{gd['code']}: {gd['msg'].strip()}"
                    found = Evidence(kind, label, text[:2000], r, i)
                    if label == "watchdog" and not gd.get("msg"):
                        pending = found          # the caught exception is on the next line
                    elif label in MERGE_NEXT:
                        merge = found
                    break
        if found is None and not DUMP.search(t) and _engine_line(t):  # an engine's error said on a line of its own
            found = Evidence("error-line", "engine", t[:2000], r, i)
        if found is None and not (continuation and r.level is None) and ("Error" in t or "Exception" in t):
            tail = TYPE_END.search(t)
            em = EMBEDDED.search(t, max(0, tail.start() - 200)) if tail else None
            if em and _message(r, t) and not NOTICE.search(t):
                found = Evidence("exception", "embedded", em.group("exc").rstrip('"')[:2000], r, i,
                                 weak=r.level not in ERROR_LEVELS, noise=teardown)
        if found is None and r.level in ERROR_LEVELS and not continuation and _message(r, t):
            if generic(t):
                found = Evidence("error-line", "logged", t[:2000], r, i)
            elif ERRORISH.search(t):
                found = Evidence("error-line", "logged", t[:2000], r, i, weak=True, noise=bool(NOTICE.search(t)))
        if found is not None:
            found.generic = generic(found.text) and found.kind != "kill"
            out.append(found)
            if found.kind != "exception":
                cur = found if found.kind in ("error-line", "device") else None


_ENGINE_LINES = None


def _engine_line(t: str) -> bool:
    """The line matches an engine's signature that the engine says on a line of its own (``Signature.line``)."""
    global _ENGINE_LINES
    if _ENGINE_LINES is None:
        from specdeploy.engines import adapters
        rx = [s.pattern.pattern for a in adapters() for s in a.triage_signatures if s.line]
        _ENGINE_LINES = re.compile("|".join(f"(?:{x})" for x in rx)) if rx else re.compile(r"(?!)")
    return bool(_ENGINE_LINES.search(t))


def collect(recs: list[Record]) -> list[Evidence]:
    """Every piece of evidence in these records, in log order."""
    streams: dict[str | None, list[tuple[int, Record]]] = {}
    for i, r in enumerate(recs):
        streams.setdefault(r.proc, []).append((i, r))
    out: list[Evidence] = []
    for body in streams.values():
        mine: list[Evidence] = []
        _stream(body, mine)
        exc_lines = {e.rec.n for e in mine if e.kind == "exception"}
        # a logged error whose own message goes on into an exception (one record): the exception is the evidence
        mine = [e for e in mine if not (e.label == "logged" and e.rec.n in exc_lines)]
        pos = {i: j for j, (i, _) in enumerate(body)}
        for e in mine:
            j = pos[e.order]
            e.after = [r for _, r in body[j + 1:j + 7]]
            if e.weak and e.label == "embedded":   # a front-end's own stack follows it: a traceback, not a mention
                nxt = [a.text for a in e.after if a.text.strip()][:1]
                e.weak = not any(FRAME_AT.match(x) for x in nxt)
        out.extend(mine)
    for e in out:
        e.near = [r.text for r in recs[max(0, e.order - 6):e.order + 4]]
    return sorted(out, key=lambda e: e.order)


def shutdowns(recs: list[Record]) -> tuple[list[Record], list[Record]]:
    """(records where a stop was requested, routine shutdown records)."""
    req, routine = [], []
    for r in recs:
        t = r.text.strip()
        if not t or not SHUT_HINT.search(t) or DUMP.search(t):
            continue
        if SHUTDOWN_REQUEST.search(t):
            req.append(r)
        elif SHUTDOWN_ROUTINE.search(t):
            routine.append(r)
    return req, routine
