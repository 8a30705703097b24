"""Find the root exception in vLLM/SGLang logs, say how the engine ended, and name the failure when it is known.

Three steps:

1. ``normalise`` turns every line format engines, containers and log shippers write into records of
   (process, rank, timestamp, text): vLLM V1 ``(Worker_TP3 pid=251559) ERROR 02-21 20:16:57 [file.py:863] ``, vLLM V0
   ``(VllmWorkerProcess pid=N) ERROR mm-dd hh:mm:ss file.py:NNN]``, Ray ``(RayWorkerWrapper pid=N, ip=...)``, SGLang
   ``[2025-02-09 21:23:00 TP2] `` (whose traceback starts mid-line and whose continuation lines carry no prefix),
   docker compose / Kubernetes / CI prefixes, journald, torch's ``[rank0]:[E...]``, ANSI colours (with or without
   their ESC byte, or written out as ``^[[`` / ``#033[``), nested prefixes and lines pasted flat.
2. Every process stream is walked for tracebacks; exception lines, and the few non-Python error lines that matter
   (NCCL watchdog, dead workers, the kernel OOM killer) are the only evidence. Config and argument dumps are data.
3. The root is the earliest specific exception (engine wrappers such as ``Engine core initialization failed`` are
   never the answer; ``Worker failed with error '<msg>'`` is unwrapped to ``<msg>``). A signature matches the root's
   own text and carries its confidence; when none matches the answer says so, names the root exception and where to
   look next.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

MAX_LINES = 200_000   # head 20k + tail 180k of anything longer
MAX_LINE = 20_000     # characters per line looked at

# ---------------------------------------------------------------------------------------------------- normaliser
ANSI = re.compile(r"(?:\x1b|\^\[|#033|\\033|\\x1b|\\e|\\u001b)\[[0-9;]{0,16}[A-Za-z]|\x1b[()][A-Z0-9]|"
                  r"\[(?:\d{1,3}(?:;\d{1,3})*)?m(?=[\s(\[]|$)")
# prefixes added around the engine's own line, stripped repeatedly (they nest)
OUTER = [
    re.compile(r"^>\s?"),                                                    # markdown quote
    re.compile(r"^\s*\d{1,6}\s+(?=[(\[])"),                                  # pasted with line numbers
    re.compile(r"^[A-Za-z0-9][\w.\-/]{0,62}\s*\|\s?"),                      # docker compose: "vllm-1  | "
    re.compile(r"^\s*\|\s?"),                                                # CI tables: "  | "
    re.compile(r"^(?:INFO|ERROR|WARNING|DEFAULT|DEBUG|NOTICE)\s+\d{4}-\d\d-\d\dT[\d:.]+Z?\s+(?:\[[^\]]{0,200}\]\s*)?"),
    re.compile(r"^\[?\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?\s"),  # ISO (docker -t, CI)
    re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [^:\[]+\[\d+\]: "),   # journald short
    re.compile(r"^\d{4}-\d\d-\d\dT\S+ \S+ [^:\[]+\[\d+\]: "),                 # journald short-iso
]
OUTER_ANY = re.compile("|".join(f"(?:{rx.pattern})" for rx in OUTER))
PROC = re.compile(r"^\((?P<body>[A-Za-z_][\w .:=,\-/]{0,120}?)\)\s?")
PROC_ANY = re.compile(r"\((?:[A-Za-z_][\w .=\-]{0,60}?) pid=\d+(?:, ip=[^)]*)?\) ")
VLLM_HDR = re.compile(r"^(?P<lvl>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\s+"
                      r"(?:\[[^\]\[]{1,120}[\]\[]{1,2}|[\w./\-]{1,120}\.py:\d+\])\s?")
BARE_SRC = re.compile(r"^[\w./\-]{1,120}\.py:\d+\]\s?")
SGL_HDR = re.compile(r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?P<tags>(?: (?:DP|TP|PP|EP|CP|ATTN_DP)\d+)*)\]\s?")
TORCH_RANK = re.compile(r"^\[rank(?P<rank>\d+)\]:\s?")
GLOG = re.compile(r"^\[[EWIF](?P<ts>(?:\d{3,4})?(?: [\d:.]+)?) ?[\w.]+\.(?:cpp|cc|h|hpp):\d+\]\s?")
TB_MID = re.compile(r"(?<=\S)\s*(?=Traceback \(most recent call last\):)")
RANK_IN = re.compile(r"(?:(?<![A-Za-z])TP|rank[= ]?|Rank )(\d+)")
RANK_TXT = re.compile(r"^\[(?:PG [^\]]*?)?Rank (\d+)\]")
CR = re.compile(r"(?:\^M|\r)+$")


@dataclass
class Record:
    n: int                 # 1-based line number in the input
    proc: str | None
    rank: int | None
    ts: str | None
    text: str
    raw: str
    hdr: bool = False      # the line carried its own log header (a new message, not a continuation)


def _outer(line: str) -> str:
    for _ in range(8):
        m = OUTER_ANY.match(line)
        if not m or not m.end():
            break
        line = line[m.end():]
    return line


def _split_flat(line: str) -> list[str]:
    """Lines pasted without their newlines: split before every worker prefix after the first."""
    if line.count("pid=") < 2:
        return [line]
    starts = [m.start() for m in PROC_ANY.finditer(line)]
    if len(starts) < 2:
        return [line]
    cuts = [0] + [s for s in starts if s > 0]
    return [line[a:b].strip() for a, b in zip(cuts, cuts[1:] + [len(line)]) if line[a:b].strip()]


def normalise(lines) -> list[Record]:
    """Every line as (process, rank, timestamp, text); SGLang continuation lines inherit their record's process."""
    lines = list(lines)
    if len(lines) > MAX_LINES:
        lines = lines[:20_000] + lines[-180_000:]
    out: list[Record] = []
    carry: tuple[str | None, int | None, str | None] = (None, None, None)
    for n, raw in enumerate(lines, 1):
        if not isinstance(raw, str):
            raw = bytes(raw).decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray)) else str(raw)
        raw = raw.rstrip("\r\n")[:MAX_LINE].replace("\x00", "")
        clean = ANSI.sub("", raw) if "[" in raw else raw
        if clean.endswith(("^M", "\r")):
            clean = CR.sub("", clean)
        for piece in _split_flat(_outer(clean)):
            proc = rank = ts = None
            text = _outer(piece)
            m = PROC.match(text.lstrip())
            if m and ("pid=" in m.group("body") or m.group("body") in ("raylet", "pid")):
                text = text.lstrip()
                body = m.group("body")
                proc = re.sub(r",? ?(?:pid|ip)=[^,)]*", "", body).strip() or body
                r = RANK_IN.search(body)
                rank = int(r.group(1)) if r else None
                text = _outer(ANSI.sub("", text[m.end():])).lstrip()
            sg = SGL_HDR.match(text)
            if sg:
                ts, tags = sg.group("ts"), sg.group("tags").strip()
                proc = proc or (tags or "main")
                r = re.search(r"TP(\d+)", tags)
                rank = int(r.group(1)) if r else rank
                text = text[sg.end():]
                carry = (proc, rank, ts)
            else:
                hdr = VLLM_HDR.match(text) or BARE_SRC.match(text)
                if hdr:
                    ts = hdr.groupdict().get("ts")
                    text = text[hdr.end():]
                tr = TORCH_RANK.match(text)
                if tr:
                    rank = int(tr.group("rank"))
                    proc = proc or f"rank{rank}"
                    text = text[tr.end():]
                g = GLOG.match(text)
                if g:
                    ts = ts or g.group("ts").strip() or None
                    text = text[g.end():]
                rt = RANK_TXT.match(text)
                if rt and rank is None:
                    rank = int(rt.group(1))
                if proc is None and not hdr and not tr and not g and carry[0] is not None:
                    proc, rank, ts = carry           # a continuation line of the last SGLang record
                elif proc is not None or hdr or tr or g:
                    carry = (None, None, None)
            parts = TB_MID.split(text, maxsplit=1) if "Traceback (most recent call last)" in text else [text]
            new = bool(sg) or (not sg and bool(hdr or tr or g))
            for part in parts:
                out.append(Record(n, proc, rank, ts, part, raw, new))
    return out


# ---------------------------------------------------------------------------------------------------- evidence
EXC = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Timeout|Failure|Fault|"
                 r"Failed)|Exception|StopIteration|KeyError))(?:\([\w.]+\))?(?::\s*(?P<msg>.*))?$")
FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<fn>\S+))?|'
                   r"^\s*File (?P<file2>\S+\.py):(?P<line2>\d+), in (?P<fn2>\S+)")
CHAIN = re.compile(r"^(?:The above exception was the direct cause|During handling of the above exception)")
DUMP = re.compile(r"(?i)(?:with config:|args: Namespace\(|server_args=ServerArgs\(|non-default args|vLLM config: \{|"
                  r"engine_args|Namespace\(|\bconfig=\{)")
GENERIC = (
    "Engine core initialization failed", "EngineDeadError", "WorkerProc initialization failed",
    "RuntimeError: Worker proc", "EngineCore encountered an issue", "Received sigquit from a child",
    "Rank 0 scheduler is dead", "Engine process failed to start", "Worker failed with error",
    "Call to collective_rpc method failed", "AsyncEngineDeadError", "Background loop has errored already",
    "MultiprocExecutor got fatal signal", "MulitprocExecutor got fatal signal", "Exception in worker",
    "See stack trace (above) for the root cause", "Failed core proc(s)", "exceptions.RayTaskError",
)
SHUTDOWN_EXC = re.compile(r"^(?:KeyboardInterrupt|(?:asyncio\.(?:exceptions\.)?)?CancelledError|SystemExit(?::\s*0)?$)")
UNWRAP = re.compile(r"Worker failed with error '(?P<msg>.+)', please check the stack trace", re.DOTALL)
# non-Python failure lines: (kind, pattern); kind "kill" decides the outcome when no exception is found
ERROR_LINES = [
    ("watchdog-exc", re.compile(r"watchdog thread terminated with exception: (?P<msg>(?!\[Rank)(?!.*Watchdog caught)"
                                r".*?)\s*$", re.IGNORECASE)),
    ("nccl-timeout", re.compile(r"Watchdog caught collective operation timeout: .*")),
    ("kill", re.compile(r"Out of memory: Killed process \d+ \([^)]*\).*|invoked oom-killer.*|oom-kill:.*")),
    ("kill", re.compile(r"Worker \S+ pid \d+ died, exit code:? -?\d+|Worker proc \S+ died unexpectedly.*|"
                        r"code=(?:killed|dumped), status=\d+/\w+|exited with (?:exit )?code:? -?\d+|"
                        r"A worker died or was killed while executing a task.*|^Killed\s*$|OOMKilled|"
                        r"start operation timed out.*|Fatal Python error: (?:Segmentation fault|Aborted|Bus error)|"
                        r"(?:Segmentation fault|Aborted|Bus error) \(core dumped\)")),
    ("remote-code", re.compile(r"\S.{0,300}contains custom code which must be executed.*")),
    ("pydantic", re.compile(r"^Value error, (?P<msg>.+?)(?: \[type=value_error.*)?$")),
    ("unhandled", re.compile(r"Unhandled exception: \S+ what\(\): (?P<msg>.*)|^\s*what\(\):\s+(?P<msg2>\S.*)")),
]
ERROR_HINT = re.compile(r"(?i)watchdog|kill|died|exit code|exited|custom code|Unhandled exception|what\(\)|Value error|"
                        r"timed out|Segmentation|Aborted|Bus error")
NCCL_WARN = re.compile(r"NCCL WARN .*")
ENGINE_PROC = re.compile(r"\((?:python[\d.]*|pt_main_thread|[Vv][Ll][Ll][Mm][^)]*|sglang[^)]*|ray::[^)]*)\)")
SHUTDOWN = re.compile(r"(?i)Shutting down|Application shutdown complete|Finished server process|\[shutdown\]|"
                      r"received signal=SIG(?:TERM|INT)|Received (?:SIGTERM|SIGINT|signal (?:2|15)\b)|"
                      r"terminated by shutdown signal|Stopping specdeploy|Deactivated successfully|"
                      r"Gracefully (?:exiting|stopping)|shutdown complete")
SIGNALS = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
           11: "SIGSEGV", 15: "SIGTERM"}


@dataclass
class _Ev:
    kind: str              # "exception" | an ERROR_LINES kind
    text: str
    rec: Record
    order: int
    location: str | None = None
    frames: list[str] = field(default_factory=list)
    block: list[str] = field(default_factory=list)    # the exception's message continuation lines
    in_tb: bool = False
    near: list[str] = field(default_factory=list)     # neighbouring lines, for the phase of an OOM only


def _evidence(recs: list[Record]) -> list[_Ev]:
    streams: dict[str | None, list[tuple[int, Record]]] = {}
    for i, r in enumerate(recs):
        streams.setdefault(r.proc, []).append((i, r))
    out: list[_Ev] = []
    for body in streams.values():
        frames: list[str] = []
        last_loc = None
        cur: _Ev | None = None
        for i, r in body:
            t = r.text.strip()
            if not t:
                cur = None
                continue
            if t.startswith("Traceback (most recent call last)"):
                frames, last_loc, cur = [], None, None
                continue
            fm = FRAME.match(t)
            if fm:
                f, ln = fm.group("file") or fm.group("file2"), fm.group("line") or fm.group("line2")
                last_loc = f"{f}:{ln}"
                frames.append(f"{f} {fm.group('fn') or fm.group('fn2') or ''}")
                cur = None
                continue
            em = EXC.match(t)
            if em and not DUMP.search(t):
                cur = _Ev("exception", t, r, i, last_loc, frames[-12:], [], bool(frames))
                out.append(cur)
                frames, last_loc = [], None
                continue
            if CHAIN.match(t):
                cur = None
                continue
            if cur is not None and len(cur.block) < 8 and (not r.hdr or r.text.startswith((" ", "\t"))):
                cur.block.append(t)
            if DUMP.search(t):
                continue
            if not ERROR_HINT.search(t):
                continue
            for kind, rx in ERROR_LINES:
                m = rx.search(t)
                if m:
                    gd = m.groupdict()
                    out.append(_Ev(kind, (gd.get("msg") or gd.get("msg2") or m.group(0)).strip(), r, i))
                    break
    for e in out:
        e.near = [r.text for r in recs[max(0, e.order - 6):e.order + 4]]
    return sorted(out, key=lambda e: e.order)


def _detail(e: _Ev, text: str) -> str:
    """pydantic puts the message of a ValidationError on the lines after it ("  Value error, ...")."""
    if re.search(r"\d+ validation errors? for \w+", text):
        detail = [b for b in e.block if not b.startswith(("For further information", "http"))][:2]
        if detail:
            return f"{text}: {' '.join(detail)}"[:2000]
    return text


def _generic(text: str) -> bool:
    return any(g in text for g in GENERIC)


# ---------------------------------------------------------------------------------------------------- signatures
HIGH, MEDIUM = "high", "medium"
OOM = re.compile(r"(?i)CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|CUDA_ERROR_OUT_OF_MEMORY")
SIGNATURES = [
    ("kimi-image-token-index", HIGH, re.compile(r"'KimiK25Config' object has no attribute 'image_token_index'"),
     ("vLLM < 0.18 reads image_token_index, which Kimi-K2.5's config lacks: set specdeploy_engine_patches: auto "
     "(patched image) or pin vLLM >= 0.18.0.")),
    ("eagle3-interface-missing", HIGH, re.compile(r"does not support EAGLE3 interface but aux_hidden_state_outputs"),
     ("DeepseekV2/V3 (and KimiK25) do not implement SupportsEagle3 before vLLM 0.18: set "
     "specdeploy_engine_patches: auto or pin vLLM >= 0.18.0.")),
    ("eagle3-target-whitelist", HIGH, re.compile(r"(?i)eagle3 is only supported for|is only supported for \[.*llama"),
     ("This vLLM accepts EAGLE-3 only for the target model types its message lists: for Kimi-K2.5/DeepSeek "
      "(rejected before 0.18) set specdeploy_engine_patches: auto or pin vLLM >= 0.18.0; for other targets use a "
      "vLLM that lists the model type.")),
    ("speculators-supports-eagle3", HIGH, re.compile(r"(?i)supports_eagle3|does not support eagle ?3(?! interface)"),
     ("The speculators hidden-state worker checks supports_eagle3 on the top-level KimiK25 wrapper: use a vLLM "
     "with SupportsEagle3 on KimiK25ForConditionalGeneration (>= 0.18.0, or the patched image).")),
    ("scheduler-is-encoder-decoder", HIGH, re.compile(r"SchedulerConfig.*is_encoder_decoder|is_encoder_decoder.*"
                                                      r"SchedulerConfig"),
     ("The speculators release predates this vLLM (SchedulerConfig gained is_encoder_decoder): install a "
     "speculators release built for the pinned vLLM.")),
    ("trust-remote-code", HIGH, re.compile(r"(?i)requires you to execute the (?:configuration|tokenizer|modeling) "
                                           r"file|contains custom code which must be executed"),
     ("The model ships its own config/tokenizer code and the loader was not allowed to run it: set "
     "specdeploy_trust_remote_code: true (--trust-remote-code); if it is set, the code path that failed did not "
     "receive it.")),
    ("port-in-use", MEDIUM, re.compile(r"(?i)\[Errno 98\] Address already in use|EADDRINUSE|address already in use"),
     ("Another process holds the port (often the previous engine still shutting down): find it with "
     "`ss -ltnp | grep <port>`, stop it or pick another specdeploy_port.")),
    ("kv-cache-no-memory", HIGH, re.compile(r"No available memory for the cache blocks|"
                                            r"Insufficient memory for KV cache|"
                                            r"larger than the maximum number of tokens that can be stored in KV cache|"
                                            r"Not enough memory\. Please try to increase --mem-fraction-static|"
                                            r"larger than the available KV cache memory"),
     ("Nothing is left for the KV cache after the weights: raise specdeploy_gpu_memory_utilization (vLLM) / "
     "--mem-fraction-static (SGLang), lower max_model_len, or free the GPU (nvidia-smi: another process?).")),
    ("dtype-unsupported", HIGH, re.compile(r"Bfloat16 is only supported on GPUs with compute capability"),
     "This GPU has no bfloat16: serve with --dtype half (float16), or use a GPU with compute capability >= 8.0."),
    ("gpu-arch-unsupported", HIGH, re.compile(r"no kernel image is available for execution on the device|"
                                              r"Unsupported architecture|sm_?\d+ is not (?:a )?supported"),
     ("The engine's compiled kernels do not include this GPU's architecture: use an engine image built for it "
     "(TORCH_CUDA_ARCH_LIST), or disable the kernel path named in the error.")),
    ("sglang-custom-allreduce-pcie", HIGH, re.compile(r"CustomAllReduceV2' object has no attribute|"
                                                      r"Custom all-?reduce.*(?:not supported|failed)", re.IGNORECASE),
     ("SGLang's custom all-reduce breaks during CUDA-graph capture without NVLink: set "
     "specdeploy_custom_all_reduce: false (--disable-custom-all-reduce).")),
    ("architecture-unsupported", MEDIUM, re.compile(r"Model architectures \[.*\] are not supported"),
     ("This engine version does not know the architecture, or failed to import its implementation: look for an "
     "earlier 'Error in inspecting model architecture' or ImportError; otherwise upgrade the engine (custom "
     "architectures need --trust-remote-code).")),
    ("request-slots-exhausted", MEDIUM, re.compile(r"alloc_req_slots runs out of memory"),
     ("The request pool is smaller than the running batch: lower --max-running-requests or raise "
     "--mem-fraction-static.")),
]
OOM_FIX = {
    "weights": "The weights do not fit in GPU memory at this tensor-parallel size: raise "
               "specdeploy_tensor_parallel_size, use a quantized checkpoint, or free the GPUs (nvidia-smi: is another "
               "process holding memory?).",
    "kv-cache": "The KV-cache allocation ran out of GPU memory: lower specdeploy_gpu_memory_utilization (vLLM) / "
                "--mem-fraction-static (SGLang) or max_model_len.",
    "sampler-warmup": "The sampler warm-up ran out of memory: lower max_num_seqs (it allocates logits for max_num_seqs"
                      " x vocab) or specdeploy_gpu_memory_utilization.",
    "cuda-graph": "CUDA-graph capture ran out of memory: lower the captured batch sizes (--cuda-graph-max-bs / "
                  "max_cudagraph_capture_size) or the memory fraction; --enforce-eager / --disable-cuda-graph "
                  "confirms.",
    "profile": "The memory-profiling forward pass (a full batch of max_num_batched_tokens) ran out of memory: lower "
               "max_num_batched_tokens / max_model_len or the memory fraction.",
    "runtime": "A rank ran out of GPU memory while serving: lower max_num_seqs / --max-running-requests or "
               "max_model_len, or leave more headroom (memory fraction).",
}
OOM_PHASES = [
    ("cuda-graph", re.compile(r"(?i)capture|cuda_?graph|CudaGraphRunner|graph_runner")),
    ("sampler-warmup", re.compile(r"(?i)sampler|_dummy_sampler_run|warming up sampler|logits\.sort|top_k_top_p")),
    ("profile", re.compile(r"(?i)profile_run|determine_available_memory|determine_num_available_blocks|_dummy_run")),
    ("kv-cache", re.compile(r"(?i)init_memory_pool|memory_pool|kv_?cache|initialize_cache|_allocate_kv|"
                            r"TokenToKVPool|initialize_from_config")),
    ("weights", re.compile(r"(?i)load_model|load_weights|model_loader|weight_loader|safetensors|Loading weights|"
                           r"checkpoint shards|default_loader")),
    ("runtime", re.compile(r"(?i)forward_batch|forward_thread|event_loop|run_batch|execute_model|forward_decode|"
                           r"worker_busy_loop|step_fn|sample_tokens")),
]
# evidence in the root's own innermost frames: (name, frame pattern, exception types it applies to)
FRAME_SIGNATURES = [("trust-remote-code", re.compile(r"\bresolve_trust_remote_code\b"),
                     re.compile(r"^(?:EOFError|ValueError)\b"))]
# where to look next when no signature names the failure: (pattern on the root, advice)
HINTS = [
    (re.compile(r"(?i)NCCL error|nccl(?:System|Internal|Unhandled\w*|InvalidUsage)Error|unhandled system error"),
     ("NCCL failed while setting up or running a collective: rerun with NCCL_DEBUG=WARN (INFO for the transport "
     "choice) to see which rank and transport failed; in containers give /dev/shm room (--ipc=host or --shm-size); "
     "check the PCIe/NVLink topology with `specdeploy nccl topo`.")),
    (re.compile(r"(?i)illegal memory access|unspecified launch failure|device-side assert|misaligned address"),
     ("A GPU kernel faulted (the exception may surface in an unrelated call): rerun with CUDA_LAUNCH_BLOCKING=1 to "
     "name the kernel, then compare against the engine's known issues for this model/attention backend.")),
    (re.compile(r"(?i)undefined symbol|ImportError|ModuleNotFoundError|cannot open shared object"),
     ("A compiled extension does not match the installed torch/CUDA: reinstall the engine image or the wheel "
     "built for this torch version.")),
    (re.compile(r"(?i)gloo|Connection closed by peer|TCPStore|timed out waiting .*ms for"),
     ("The distributed rendezvous broke: check that every rank/node can reach the others (dist-init address, "
     "firewall, GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME) and that no rank died first.")),
    (re.compile(r"(?i)No space left on device"),
     ("A disk filled up (model cache, torch.compile / Triton caches, /dev/shm or /tmp): free space or move the cache "
     "(HF_HOME, VLLM_CACHE_ROOT, TRITON_CACHE_DIR) to a larger disk.")),
    (re.compile(r"(?i)does not appear to have a file named|not a valid model identifier|Repository Not Found|"
                r"401 Client Error|gated repo|HFValidationError|Repo id must|No such file or directory.*(?:config|"
                r"safetensors|tokenizer)"),
     ("The model (or drafter) path or Hugging Face id does not resolve on this host: check the path exists on every "
     "host (`specdeploy preflight`), or the HF token for gated repos.")),
    (re.compile(r"(?i)Permission denied"),
     "The engine's user cannot read or write a path: check ownership of the model, cache and log directories."),
    (re.compile(r"(?i)operation not permitted when stream is capturing"),
     ("A kernel is not capturable in a CUDA graph with this combination (often torch.compile): disable one of them "
     "(--disable-cuda-graph / drop --enable-torch-compile) to confirm.")),
]


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


def _ev_dict(e: _Ev, why: str) -> dict:
    return {"line": e.rec.n, "text": e.rec.raw.strip()[:500], "why": why}


def _signature(root: _Ev, text: str):
    probe = " ".join([text] + root.block[:3])
    for name, conf, rx, fix in SIGNATURES:
        if rx.search(probe):
            return name, conf, fix
    for name, frx, erx in FRAME_SIGNATURES:
        if erx.match(text) and any(frx.search(f) for f in root.frames[-3:]):
            return next((n, c, f) for n, c, _, f in SIGNATURES if n == name)
    if OOM.search(probe):
        ctx = " ".join(root.frames + [probe] + root.near)
        phase = next((p for p, rx in OOM_PHASES if rx.search(ctx)), None)
        if phase:
            return f"cuda-oom-{phase}", MEDIUM, OOM_FIX[phase]
        return "cuda-oom", MEDIUM, ("A rank ran out of GPU memory; the phase is not in the log: look at the lines "
                                    "before it (loading weights, KV cache, CUDA graphs) and lower the matching "
                                    "setting, or check nvidia-smi for another process on that GPU.")
    return None


def _timeout_sig(e: _Ev):
    first = re.search(r"SeqNum=(\d+)", e.text)
    if first and int(first.group(1)) <= 2:
        return ("nccl-first-collective-hang", MEDIUM,
                ("The first collective never completed, which on PCIe hosts is usually a P2P hang: test with "
                 "NCCL_P2P_DISABLE=1, check ACS/IOMMU with `specdeploy nccl topo`; on SGLang keep "
                 "--disable-custom-all-reduce."))
    return ("nccl-collective-timeout", MEDIUM,
            ("A rank stopped taking part in a collective mid-run; the timeout is a consequence: find the first rank "
             "that failed or hung (its own error or its last log line), and rerun with NCCL_DEBUG=WARN."))


# where an engine (re)starts: a unit's journal holds every earlier run, and only the latest that ended says why
RUN_START = re.compile(r"^(?:Started|Starting) [\w@.\-]+\.service\b|vLLM API server version|"
                       r"specdeploy engine simulator:|server_args=ServerArgs\(")


def triage_lines(lines, kernel=None) -> Triage:
    """Triage engine log lines; ``kernel`` are kernel-log (dmesg / journalctl -k) lines, evidence for OOM kills.

    A log with several engine starts (a unit's journal across restarts and deploys) is triaged run by run from the
    latest: the answer is the latest run that shows how it ended; earlier runs never shadow it."""
    recs = normalise(lines)
    starts = [i for i, r in enumerate(recs) if RUN_START.search(r.text)]
    cuts = [0] + [i for i in starts if i > 0]
    res = None
    for a, b in reversed(list(zip(cuts, cuts[1:] + [len(recs)]))):
        res = _triage(recs[a:b], kernel)
        if res.outcome != "no-exception-found":
            return res
    return res if res is not None else _triage([], kernel)


def _triage(recs: list[Record], kernel) -> Triage:
    evs = _evidence(recs)
    excs = [e for e in evs if e.kind == "exception"]
    shut_excs = [e for e in excs if SHUTDOWN_EXC.match(e.text)]
    excs = [e for e in excs if e not in shut_excs]
    specific: list[tuple[_Ev, str]] = []
    for e in excs:
        w = UNWRAP.search(e.text) or next((UNWRAP.search(b) for b in e.block if UNWRAP.search(b)), None)
        if w:
            specific.append((e, w.group("msg").strip()))
        elif not _generic(e.text):
            specific.append((e, e.text))
    others = [e for e in evs if e.kind != "exception"]
    kernel_kills = [ln.strip() for ln in (kernel or []) if re.search(r"Out of memory: Killed process|oom-kill:", ln)
                    and ENGINE_PROC.search(ln)]
    shutdown = [r for r in recs if SHUTDOWN.search(r.text) and not DUMP.search(r.text)]

    def result(outcome, ev: _Ev | None, text, sig=None, why="root exception", next_step=None):
        name, conf, fix = sig or (None, None, None)
        evidence = [_ev_dict(ev, why)] if ev else []
        if not fix and text:
            hint = next((h for rx, h in HINTS if rx.search(text)), None)
            next_step = next_step or hint or (
                f"No known signature: search the engine's issues for this exception verbatim; the innermost frame is "
                f"{ev.location}." if ev and ev.location else
                "No known signature: search the engine's issues for this message verbatim and read the lines just "
                "before it in the same process.")
            fix = "unknown failure: " + next_step
        return Triage(outcome, text, ev.location if ev else None, ev.rec.proc if ev else None, name, fix, conf,
                      ev.rec.rank if ev else None, ev.rec.ts if ev else None, evidence, next_step)

    specific = [(e, _detail(e, t)) for e, t in specific]
    tb_specific = [(e, t) for e, t in specific if e.in_tb] or specific
    if tb_specific:
        e, text = tb_specific[0]
        res = result("failed", e, text, _signature(e, text))
        if "NCCL" in text:
            res.evidence += [{"line": r.n, "text": r.raw.strip()[:500], "why": "NCCL's own warning"}
                             for r in [r for r in recs if NCCL_WARN.search(r.text)][:3]]
        return res
    # non-Python failure lines, in log order
    for e in others:
        if e.kind == "watchdog-exc" or e.kind == "unhandled":
            return result("failed", e, e.text, _signature(e, e.text), "the exception the NCCL watchdog caught")
        if e.kind == "pydantic":
            text = "ValueError: " + e.text
            return result("failed", e, text, _signature(e, text), "the validation error's message")
        if e.kind == "remote-code":
            return result("failed", e, e.text, _signature(e, e.text), "the loader asked to run the model's own code")
        if e.kind == "kill":
            return _killed(e, kernel_kills, shutdown)
        if e.kind == "nccl-timeout":
            return result("failed", e, e.text, _timeout_sig(e), "the first collective timeout")
    if kernel_kills:
        t = Triage("killed", kernel_kills[-1], None, None, "host-oom-killer", _OOM_KILLER_FIX, HIGH,
                   evidence=[{"line": None, "text": k[:500], "why": "kernel log"} for k in kernel_kills[-3:]])
        return t
    if excs:
        e = excs[-1]
        return result("failed", e, e.text, None, "only the engine's generic wrapper was logged",
                      "Only the engine's wrapper was logged, not the failing worker's exception: read the complete "
                      "log from the start of the load (journalctl -u UNIT, or every worker's output) and raise the "
                      "level (VLLM_LOGGING_LEVEL=DEBUG / --log-level debug).")
    if shutdown or shut_excs:
        r = (shutdown or [e.rec for e in shut_excs])[0]
        return Triage("clean-shutdown", None, None, r.proc, None, None, None, r.rank, r.ts,
                      [{"line": r.n, "text": r.raw.strip()[:500], "why": "shutdown requested"}],
                      "The engine was asked to stop (SIGTERM/SIGINT) and shut down; nothing failed.")
    return Triage("no-exception-found", None, None, None, None, None, None, next_step=(
        "No exception, no kill and no shutdown in these lines: the log may be cut before the failure, or the engine "
        "hung. Give the complete log (journalctl -u UNIT --no-pager), and for hangs py-spy dump the workers."))


_OOM_KILLER_FIX = ("The kernel's OOM killer ended the engine: host RAM (or the container's memory limit), not GPU "
                   "memory, ran out (loading shards, pinned memory, CPU offload, many workers). Give the host or "
                   "container more memory, lower CPU-side buffers (--swap-space, CPU offload), or load fewer shards "
                   "in parallel.")


def _killed(e: _Ev, kernel_kills: list[str], shutdown: list[Record]) -> Triage:
    sig_no = None
    m = re.search(r"exit code:? (-?\d+)|status=(\d+)/|exited with (?:exit )?code:? (-?\d+)", e.text)
    if m:
        code = int(next(g for g in m.groups() if g is not None))
        sig_no = -code if code < 0 else (code - 128 if code > 128 else (code if "status=" in e.text else None))
    for word, no in (("Segmentation fault", 11), ("Aborted", 6), ("Bus error", 7), ("OOMKilled", 9)):
        if word in e.text:
            sig_no = no
    name = SIGNALS.get(sig_no or 0)
    text = e.text + (f" ({name})" if name and name not in e.text else "")
    ev = [_ev_dict(e, "the process ended by a signal, without a Python traceback")]
    t = (e.rec.proc, e.rec.rank, e.rec.ts)
    if name in ("SIGTERM", "SIGINT") and shutdown:
        return Triage("clean-shutdown", None, None, *t[:1], None, None, None, t[1], t[2], ev,
                      "The engine was asked to stop and was stopped by a signal; nothing failed.")
    if "start operation timed out" in e.text:
        return Triage("killed", text, None, t[0], "systemd-start-timeout",
                      "systemd stopped the engine because the model load took longer than the unit's start timeout: "
                      "raise specdeploy_start_timeout (a trillion-parameter load takes tens of minutes).", HIGH,
                      t[1], t[2], ev)
    if m and sig_no is None and "exit" in e.text:
        nxt = ("The process exited with an error code and no traceback in these lines: read the lines just before "
               "it, and the complete log of that process.")
        return Triage("failed", text, None, t[0], None, "unknown failure: " + nxt, None, t[1], t[2], ev, nxt)
    oom_line = any(w in e.text for w in ("Out of memory: Killed process", "oom-kill", "OOMKilled"))
    if oom_line or (kernel_kills and name in ("SIGKILL", None)):
        ev += [{"line": None, "text": k[:500], "why": "kernel log"} for k in kernel_kills[-3:]]
        return Triage("killed", text, None, t[0], "host-oom-killer", _OOM_KILLER_FIX, HIGH, t[1], t[2], ev)
    nxt = ("The process was killed without a traceback. If it was SIGKILL, check the kernel log for the OOM killer: "
           "`specdeploy triage --journal UNIT` (reads journalctl -k) or `journalctl -k | grep -i 'killed process'`; "
           "SIGABRT/SIGSEGV come from native code: look at the lines just before it.")
    return Triage("killed", text, None, t[0], None, "unknown: " + nxt, None, t[1], t[2], ev, nxt)


def read_log(path) -> list[str]:
    """A log file as text lines, whatever its bytes (binary, another encoding, NULs)."""
    with open(path, "rb") as fh:
        data = fh.read()
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        text = data.decode("utf-16", "replace")
    else:
        text = data.decode("utf-8", "replace")
    return text.splitlines()


def triage_files(paths, kernel=None) -> Triage:
    lines: list[str] = []
    for p in paths:
        lines.extend(read_log(p))
    return triage_lines(lines, kernel)
