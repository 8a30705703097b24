"""Find the root exception in vLLM/SGLang multi-process logs, and name it when it is a known failure.

Workers interleave prefixed lines (``(Worker_TP3 pid=251559) ERROR 02-21 20:16:57 [multiproc_executor.py:863]
...``); the engine core wraps the real error in a generic one (``Engine core initialization failed. See root
cause above``) that is never the answer.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

PREFIX = re.compile(
    r"^(?:\x1b\[[0-9;]*m)*\((?P<proc>[A-Za-z_]+[A-Za-z0-9_]*)(?: pid=(?P<pid>\d+))?\)(?:\x1b\[[0-9;]*m)?\s*"
    r"(?:(?:ERROR|WARNING|INFO|DEBUG|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]*\]\s?)?")
JOURNAL = re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [^:]+\[\d+\]: ")
PLAIN_LOG = re.compile(r"^(?:ERROR|WARNING|INFO|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ")
EXC = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Timeout|Failure)|"
                 r"AssertionError|KeyError|StopIteration)(?::\s*(?P<msg>.*))?$")
FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)')

GENERIC = (
    "Engine core initialization failed",
    "Worker failed with error",
    "EngineDeadError",
    "WorkerProc initialization failed",
    "RuntimeError: Worker proc",
    "Exception: WorkerProc",
    "EngineCore encountered an issue",
    "Received sigquit from a child process",
    "Rank 0 scheduler is dead",
)

SIGNATURES = [
    ("kimi-image-token-index", re.compile(r"'KimiK25Config' object has no attribute 'image_token_index'"),
     "vLLM < 0.18 reads image_token_index, which Kimi-K2.5's config lacks: set specdeploy_engine_patches: auto "
     "(patched image) or pin vLLM >= 0.18.0."),
    ("eagle3-interface-missing", re.compile(r"Model does not support EAGLE3 interface but aux_hidden_state_outputs"),
     "DeepseekV2/V3 (and KimiK25) do not implement SupportsEagle3 before vLLM 0.18: set "
     "specdeploy_engine_patches: auto or pin vLLM >= 0.18.0."),
    ("eagle3-target-whitelist", re.compile(r"(?i)eagle3 is only supported for|is only supported for \[.*llama"),
     "vLLM < 0.18 rejects kimi_k2/deepseek as EAGLE-3 targets: set specdeploy_engine_patches: auto or pin "
     "vLLM >= 0.18.0."),
    ("speculators-supports-eagle3", re.compile(r"(?i)supports_eagle3|does not support eagle ?3(?! interface)"),
     "The speculators hidden-state worker checks supports_eagle3 on the top-level KimiK25 wrapper: use a vLLM "
     "with SupportsEagle3 on KimiK25ForConditionalGeneration (>= 0.18.0, or the patched image)."),
    ("scheduler-is-encoder-decoder", re.compile(r"SchedulerConfig.*is_encoder_decoder|is_encoder_decoder.*SchedulerConfig"),
     "The speculators release predates this vLLM (SchedulerConfig gained is_encoder_decoder): install a "
     "speculators release built for the pinned vLLM."),
    ("tokenizer-trust-remote-code", re.compile(r"(?i)trust_remote_code=True|requires you to execute the "
                                               r"(?:configuration|tokenizer) file|contains custom code"),
     "The model ships its own tokenizer/config code: set specdeploy_trust_remote_code: true."),
    ("nccl-watchdog-timeout", re.compile(r"(?i)watchdog caught collective operation timeout|NCCL watchdog|"
                                         r"ProcessGroupNCCL.*timed? ?out|collective operation timeout"),
     "An NCCL collective hung: on PCIe check ACS/IOMMU (`specdeploy nccl topo`), then try NCCL_P2P_DISABLE=1; "
     "for SGLang keep --disable-custom-all-reduce."),
    ("cuda-oom", re.compile(r"(?i)CUDA out of memory|OutOfMemoryError"),
     "One rank ran out of GPU memory: lower specdeploy_gpu_memory_utilization or max_model_len, or check for "
     "another process on that GPU (nvidia-smi)."),
]


@dataclass
class Triage:
    root_cause: str | None
    location: str | None
    worker: str | None
    signature: str | None
    fix: str | None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Exc:
    line: str
    location: str | None
    worker: str | None
    order: int


def _split(line: str) -> tuple[str | None, str]:
    line = JOURNAL.sub("", line.rstrip("\n"))
    m = PREFIX.match(line)
    if m:
        return m.group("proc"), line[m.end():]
    return None, PLAIN_LOG.sub("", line)


def _exceptions(lines: list[str]) -> list[_Exc]:
    """Walk each process's own stream; every traceback ends in an exception line."""
    streams: dict[str | None, list[str]] = {}
    order: dict[tuple[str | None, int], int] = {}
    for i, raw in enumerate(lines):
        proc, text = _split(raw)
        streams.setdefault(proc, []).append(text)
        order[(proc, len(streams[proc]) - 1)] = i
    out = []
    for proc, body in streams.items():
        last_frame = None
        in_tb = False
        for j, text in enumerate(body):
            if text.startswith("Traceback (most recent call last)"):
                in_tb, last_frame = True, None
                continue
            fm = FRAME.match(text)
            if fm:
                last_frame = f"{fm.group('file')}:{fm.group('line')}"
                continue
            em = EXC.match(text.strip())
            if em and (in_tb or proc is not None):
                out.append(_Exc(text.strip(), last_frame, proc, order[(proc, j)]))
                in_tb = False
    return sorted(out, key=lambda e: e.order)


def _is_generic(text: str) -> bool:
    return any(g in text for g in GENERIC)


def triage_lines(lines: list[str]) -> Triage:
    excs = _exceptions(lines)
    specific = [e for e in excs if not _is_generic(e.line)]
    # a known signature anywhere in the log wins (it may sit on a non-exception line, e.g. an NCCL watchdog)
    for sig, rx, fix in SIGNATURES:
        hit = next((e for e in specific if rx.search(e.line)), None)
        if hit:
            return Triage(hit.line, hit.location, hit.worker, sig, fix)
    for sig, rx, fix in SIGNATURES:
        for raw in lines:
            proc, text = _split(raw)
            if rx.search(text) and not _is_generic(text):
                return Triage(text.strip(), None, proc, sig, fix)
    if specific:
        # earliest specific exception, preferring worker processes over the engine core and API server
        workers = [e for e in specific if e.worker and e.worker.startswith("Worker")]
        first = min(workers or specific, key=lambda e: e.order)
        return Triage(first.line, first.location, first.worker, None,
                      "unknown failure: this is the root exception verbatim; search the engine's issues for it")
    if excs:
        e = excs[-1]
        return Triage(e.line, e.location, e.worker, None, "only the engine's generic wrapper was logged; "
                      "raise the log level (VLLM_LOGGING_LEVEL=DEBUG) and look at the worker logs")
    return Triage(None, None, None, None, None)


def triage_files(paths) -> Triage:
    lines: list[str] = []
    for p in paths:
        with open(p, errors="replace") as fh:
            lines.extend(fh.readlines())
    return triage_lines(lines)
