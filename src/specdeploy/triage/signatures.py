"""Known failures: a signature matches the root's own text (or a line of the same process right after it, which is
then its evidence) and carries a fix and a confidence. ``high`` only where that text names the cause; a fix that
is a likely reading of a symptom is ``medium``. When none matches, ``HINTS`` say where to look next."""
from __future__ import annotations

import re

from specdeploy.triage.evidence import Evidence

# ---------------------------------------------------------------------------------------------------- signatures
HIGH, MEDIUM = "high", "medium"
OOM = re.compile(r"(?i)(?:CUDA|HIP|NPU) out of memory|OutOfMemoryError|(?:CUDA|HIP)(?: driver)? error: out of memory|"
                 r"CUDA_ERROR_OUT_OF_MEMORY|hipErrorOutOfMemory")
# engine-independent; each engine's own come first (its adapter's ``triage_signatures``)
GENERIC = [
    ("trust-remote-code", HIGH, re.compile(r"(?i)requires you to execute the (?:configuration|tokenizer|modeling) "
                                           r"file|contains custom code which must be executed"),
     ("The model ships its own config/tokenizer code and the loader was not allowed to run it: set "
     "specdeploy_trust_remote_code: true (--trust-remote-code); if it is set, the code path that failed did not "
     "receive it.")),
    ("port-in-use", MEDIUM, re.compile(r"(?i)\[Errno 98\] Address already in use|EADDRINUSE|address already in use|"
                                       r"(?:address|port) (?:and port )?(?:have|has) been bound already|"
                                       r"could not bind to address"),
     ("Another process holds the port (often the previous engine still shutting down, or a second engine on the "
      "same host): find it with `ss -ltnp | grep <port>`, stop it or pick another specdeploy_port; HCCL's listen "
      "port (Ascend) is moved per engine with HCCL_IF_BASE_PORT.")),
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
                                              r"(?i:Unsupported (?:gpu )?architecture)|sm_?\d+ is not (?:a )?supported|"
                                              r"Unknown GPU architecture|GPU archs? of \[.*\] (?:is|are) invalid or "
                                              r"not supported"),
     ("The engine's compiled kernels do not include this GPU's architecture: use an engine image built for it "
     "(TORCH_CUDA_ARCH_LIST), or disable the kernel path named in the error.")),
    ("architecture-unsupported", MEDIUM, re.compile(r"Model architectures \[.*\] are not supported"),
     ("This engine version does not know the architecture, or failed to import its implementation: look for an "
     "earlier 'Error in inspecting model architecture' or ImportError; otherwise upgrade the engine (custom "
     "architectures need --trust-remote-code).")),
    ("gpu-arch-no-kernel", MEDIUM, re.compile(r"HIP error: invalid device function|hipErrorNoBinaryForGpu|"
                                              r"CUDA error: invalid device function"),
     ("No kernel of this build runs on this GPU (\"invalid device function\"): the engine image was most likely built "
      "for other architectures; use one built for this GPU (PYTORCH_ROCM_ARCH / TORCH_CUDA_ARCH_LIST), and on "
      "ROCm consumer cards check the HSA_OVERRIDE_GFX_VERSION the image expects.")),
    ("bound-unit-stopped", HIGH, re.compile(r"is bound to inactive unit (\S+?)\.? Stopping, too|"
                                            r"this engine stopped with its weight-cache daemon (\S+?),"),
     ("systemd stopped this unit because the unit it is bound to (BindsTo=) went away, e.g. an engine's "
      "weight-cache daemon (specdeploy-<engine>-weights.service): its journal says why it ended; starting this unit "
      "starts it again first (for a daemon, a full load), as does the next deploy.")),
    ("nccl-socket-connect", MEDIUM, re.compile(r"socketStartConnect: Connect to \S+ failed|socketProgress: Connection "
                                               r"closed by remote peer"),
     ("NCCL could not reach a peer over its socket transport: set NCCL_SOCKET_IFNAME (and GLOO_SOCKET_IFNAME) on "
      "every node to the interface whose address the other nodes reach (not docker0 or a bridge), and check the "
      "firewall between the nodes.")),
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
# a rank that only saw another rank of its group go away (Gloo's and the engines' own words)
RENDEZVOUS = re.compile(r"(?i)gloo|Connection closed by peer|TCPStore|timed out waiting .*ms for|"
                        r"(?:leader|worker node|rank) (?:at \S+ )?went away|did not join within")
# where to look next when no signature names the failure: (pattern on the root, advice)
HINTS = [
    (re.compile(r"(?i)NCCL error|nccl(?:System|Internal|Unhandled\w*|InvalidUsage)Error|unhandled system error"),
     ("NCCL failed while setting up or running a collective: rerun with NCCL_DEBUG=WARN (INFO for the transport "
     "choice) to see which rank and transport failed; in containers give /dev/shm room (--ipc=host or --shm-size); "
     "check the PCIe/NVLink topology with `specdeploy nccl topo`.")),
    (re.compile(r"(?i)illegal memory access|unspecified launch failure|device-side assert|misaligned address|"
                r"Assertion `|HSA_STATUS_ERROR|aivec error|aivector error|aicore error|exception of \w+ error|"
                r"MPU address|invalid device pointer"),
     ("A GPU kernel faulted (the exception may surface in an unrelated call): rerun with CUDA_LAUNCH_BLOCKING=1 to "
     "name the kernel, then compare against the engine's known issues for this model/attention backend.")),
    (re.compile(r"(?i)HCCL|hccl\w*InitRoot|Transport init error|\bE[IJ]\d{4}\b"),
     ("HCCL failed to set up its communicator: check that every rank reaches the others (HCCL_SOCKET_IFNAME, the "
      "NPUs' device IPs with hccn_tool), that no other job holds these NPUs or HCCL's ports, and run hccl_test "
      "across the same devices.")),
    (re.compile(r"panicked at"),
     ("A component written in Rust (Dynamo's frontend, sgl-router) panicked: the message after 'panicked at' says what "
      "it could not do (bind a port, import the engine, a state it did not expect). Check that the front-end and the "
      "engine it drives are versions released together, and rerun with RUST_BACKTRACE=1 for the backtrace.")),
    (re.compile(r"terminate called|double free|corrupted|(?:malloc|free|realloc)\(\)|munmap_chunk|stack smashing|"
                r"[Cc]heck failed|CHECK_\w+ failed|Assertion failed"),
     ("Native code aborted (an uncaught C++ exception, a failed CHECK or assert, heap corruption): usually a compiled "
      "extension built for another torch, driver or device, or a kernel writing out of bounds. Get the native "
      "backtrace (a core dump, or gdb -p on the worker; CUDA_LAUNCH_BLOCKING=1 for GPU kernels) and compare the "
      "extension's build with the installed torch.")),
    (re.compile(r"(?i)NIXL|\bUCX\b"),
     ("NIXL (the KV transfer of prefill/decode disaggregation) failed: check that both sides run the same NIXL and "
      "connector settings, the same TP layout, and that the transport (UCX, RDMA) reaches the peer.")),
    (re.compile(r"(?i)NPU function error|\bERR\d{5}\b|rtGetDevice|SetDevice|torch_npu"),
     ("The NPU runtime (CANN, torch_npu) failed: check that driver, firmware, CANN and torch_npu versions match "
      "(npu-smi info; the plog under ~/ascend/log), that the container sees the NPUs (ASCEND_VISIBLE_DEVICES, the "
      "davinci devices) and that no other process holds them.")),
    (re.compile(r": (?:not found|command not found|Permission denied|No such file or directory)$"),
     ("The launch script failed before the engine started: run it with the shell it was written for (`source` needs "
      "bash, not sh) and check that the command and paths exist on the node (module load, the virtualenv).")),
    (re.compile(r"(?i)undefined symbol|ImportError|ModuleNotFoundError|cannot open shared object"),
     ("A compiled extension does not match the installed torch/CUDA: reinstall the engine image or the wheel "
     "built for this torch version.")),
    (RENDEZVOUS,
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




def all_signatures() -> list[tuple]:
    """(name, confidence, pattern, fix): every registered engine's signatures, then the engine-independent ones."""
    from specdeploy.engines import adapters
    own = [(s.name, s.confidence, s.pattern, s.fix) for a in adapters() for s in a.triage_signatures]
    return own + GENERIC


def _named(name: str):
    return next((n, c, f) for n, c, _, f in all_signatures() if n == name)


def signature(root: Evidence, text: str):
    """(name, confidence, fix, evidence record, why) of the first signature that matches, or None."""
    probe = " ".join([text] + root.block[:3])
    for name, conf, rx, fix in all_signatures():
        if rx.search(probe):
            return name, conf, fix, root.rec, "root cause"
        hit = next((r for r in root.after if rx.search(r.text)), None)
        if hit is not None:
            return name, conf, fix, hit, "the line that names the cause"
    for name, frx, erx in FRAME_SIGNATURES:
        if erx.match(text) and any(frx.search(f) for f in root.frames[-3:]):
            return (*_named(name), root.rec, "root cause")
    if OOM.search(probe):
        ctx = " ".join(root.frames + [probe] + root.near)
        phase = next((p for p, rx in OOM_PHASES if rx.search(ctx)), None)
        if phase:
            return f"cuda-oom-{phase}", MEDIUM, OOM_FIX[phase], root.rec, "root cause"
        return ("cuda-oom", MEDIUM, ("A rank ran out of GPU memory; the phase is not in the log: look at the lines "
                                     "before it (loading weights, KV cache, CUDA graphs) and lower the matching "
                                     "setting, or check nvidia-smi for another process on that GPU."),
                root.rec, "root cause")
    return None


def hint(text: str) -> str | None:
    return next((h for rx, h in HINTS if rx.search(text)), None)


def timeout_signature(e: Evidence):
    first = re.search(r"SeqNum=(\d+)", e.text)
    if first and int(first.group(1)) <= 2:
        return ("nccl-first-collective-hang", MEDIUM,
                ("The first collective never completed, which on PCIe hosts is usually a P2P hang: test with "
                 "NCCL_P2P_DISABLE=1, check ACS/IOMMU with `specdeploy nccl topo`; on SGLang keep "
                 "--disable-custom-all-reduce."), e.rec, "the first collective timeout")
    return ("nccl-collective-timeout", MEDIUM,
            ("A rank stopped taking part in a collective mid-run; the timeout is a consequence: find the first rank "
             "that failed or hung (its own error or its last log line), and rerun with NCCL_DEBUG=WARN."),
            e.rec, "the first collective timeout")
