"""Evidence beyond Python and ranking by causality, each on the smallest log that shows it: native aborts, Rust
panics, OOM killers (kernel, systemd, container runtime, Slurm), schedulers and probes, vanished processes, native
CUDA/NCCL/NIXL errors; a later traceback over an earlier typeless line, the cause over its wrapper, teardown noise and
fallback notices never the root, and an honest answer when only noise is left. The prefixes of the shapes an
operator pastes are checked record by record at the end."""
from __future__ import annotations

import json

import pytest

from specdeploy.triage import normalise, triage_lines

V1 = "(EngineCore_DP0 pid=270) ERROR 11-19 12:16:36 [core.py:842] "
TB = ["Traceback (most recent call last):", '  File "/v/worker/gpu_worker.py", line 12, in execute_model']


@pytest.mark.parametrize("lines,outcome,root,signature", [
    # native: a failed CHECK, a C assert, an uncaught C++ exception with its what(), heap corruption
    (["F0101 12:00:00.000000  1234 allocator.cc:120] Check failed: size <= capacity (9 vs. 8)",
      "*** Check failure stack trace: ***", "Aborted (core dumped)"], "failed", "Check failed: size <= capacity", None),
    (["python3: /src/csrc/moe_align.cu:88: void align(): Assertion `n % 8 == 0' failed.", "Aborted (core dumped)"],
     "failed", "Assertion `n % 8 == 0' failed", None),
    (["terminate called after throwing an instance of 'std::runtime_error'", "  what():  nixlAgent: backend failed",
      "terminate called recursively", "Aborted (core dumped)"], "failed", "'std::runtime_error': what(): nixlAgent",
     None),
    (["(EngineCore_DP0 pid=9) INFO 01-01 00:00:00 [core.py:1] Loading weights took 3.1 seconds",
      "double free or corruption (out)", "Fatal Python error: Aborted"], "failed", "double free or corruption (out)",
     None),
    # Rust: a new-style panic (message on the next line) and its repeats; an old-style one
    (["thread 'tokio-runtime-worker' panicked at lib/llm/src/http/service/service_v2.rs:69:33:",
      "could not bind to address: 0.0.0.0:8000", "note: run with `RUST_BACKTRACE=1` environment variable",
      'Error: task 20 panicked with message "could not bind to address: 0.0.0.0:8000"'],
     "failed", "service_v2.rs:69:33: could not bind to address: 0.0.0.0:8000", "port-in-use"),
    (["thread 'main' panicked at 'called `Option::unwrap()` on a `None` value', src/main.rs:10:5"], "failed",
     "called `Option::unwrap()` on a `None` value", None),
    # the OOM killer in the words of systemd, the kernel (through journald), Slurm's cgroup, a container runtime
    (["Feb 21 20:16:57 gpu-a systemd[1]: vllm.service: A process of this unit has been killed by the OOM killer.",
      "Feb 21 20:16:57 gpu-a systemd[1]: vllm.service: Main process exited, code=killed, status=9/KILL",
      "Feb 21 20:16:57 gpu-a systemd[1]: vllm.service: Failed with result 'oom-kill'."], "killed",
     "killed by the OOM killer", "host-oom-killer"),
    (["Feb 21 20:16:57 gpu-a kernel: Out of memory: Killed process 4100 (python3) total-vm:2119912kB, anon-rss:18kB"],
     "killed", "Killed process 4100 (python3)", "host-oom-killer"),
    (["slurmstepd: error: Detected 1 oom_kill event in StepId=11300781.0. Some of the step tasks have been OOM Killed.",
      "srun: error: node17: task 0: Out Of Memory"], "killed", "oom_kill event", "host-oom-killer"),
    (["    Last State:     Terminated", "      Reason:       OOMKilled", "      Exit Code:    137"], "killed",
     "OOMKilled", "host-oom-killer"),
    # schedulers and orchestrators: a time limit, a cancel by the user, a probe that restarted the container
    (["slurmstepd: error: *** JOB 494583 ON gpu17 CANCELLED AT 2024-04-20T09:09:37 DUE TO TIME LIMIT ***"], "killed",
     "DUE TO TIME LIMIT", "scheduler-time-limit"),
    (["slurmstepd: error: *** JOB 494583 ON gpu17 CANCELLED AT 2024-04-20T09:09:37 ***"], "clean-shutdown", None,
     None),
    (['  Warning  Unhealthy  3m  kubelet  Startup probe failed: Get "http://10.0.0.5:8000/health": connect: refused',
      "  Normal   Killing    3m  kubelet  Container vllm failed startup probe, will be restarted"], "killed",
     "Startup probe failed", "k8s-probe-restart"),
    # signals from native code, and processes that went away with no traceback of their own
    (["*** SIGSEGV received at time=1700000000 on cpu 3 ***", "PC: @     0x7f00deadbeef  (unknown)"], "killed",
     "SIGSEGV", None),
    (["ERROR 10-23 18:21:12 [core_client.py:597] Engine core proc EngineCore_DP0 died unexpectedly, shutting down "
      "client."], "killed", "EngineCore_DP0 died unexpectedly", None),
    (["ERROR 11-12 10:29:35 [serving_chat.py:948] vllm.engine.multiprocessing.MQEngineDeadError: Engine loop is not "
      "running. Inspect the stacktrace to find the original error: RuntimeError('Engine process (pid 514) died.')."],
     "killed", "Engine process (pid 514) died", None),
    (["The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: "
      "Worker unexpectedly exits with a connection error code 2. (1) The process is killed by SIGKILL by OOM killer "
      "due to high memory usage."], "killed", "worker process has died", None),
    # native CUDA/NCCL/NIXL errors, a launch script's own error
    (["h100:139:1092 [7] misc/socket.cc:485 NCCL WARN Cuda failure 'out of memory'"], "failed",
     "Cuda failure 'out of memory'", None),
    ([V1 + "NIXL transfer failed: NIXL_ERR_REMOTE_DISCONNECT"], "failed", "NIXL_ERR_REMOTE_DISCONNECT", None),
    (["run.sh: line 18: vllm: command not found"], "failed", "vllm: command not found", None),
    (["2025-05-15T08:05:11.136Z  INFO worker.graceful_shutdown: [VllmWorker:1] Received shutdown signal, shutting "
      "down DistributedRuntime"], "clean-shutdown", None, None),
])
def test_evidence_beyond_python_and_the_outcome_it_implies(lines, outcome, root, signature):
    res = triage_lines(lines)
    assert res.outcome == outcome, res
    assert (root in (res.root_cause or "")) if root else res.root_cause is None, res.root_cause
    assert res.signature == signature, res.signature
    if res.outcome in ("failed", "killed") and not signature:
        assert res.next_step and res.fix.startswith("unknown"), res


def test_native_aborts_and_panics_say_where_to_look():
    assert "RUST_BACKTRACE=1" in triage_lines(["thread 'main' panicked at src/router.rs:463:40:", "boom"]).next_step
    assert "native backtrace" in triage_lines(["double free or corruption (out)"]).next_step
    assert "NIXL" in triage_lines([V1 + "NIXL transfer failed: NIXL_ERR_BACKEND"]).next_step
    assert "bash" in triage_lines(["run.sh: 18: source: not found"]).next_step


# ------------------------------------------------------------------------------------------------ ranking
def test_a_later_traceback_outranks_an_earlier_typeless_error_line():
    lines = [V1 + "Failed to load the fast tokenizer, an error occurred", V1 + "Loading weights took 3.1 seconds",
             *TB, "ValueError: shard 3 has shape (96,) but the model expects (48,)"]
    assert triage_lines(lines).root_cause.startswith("ValueError: shard 3")
    # alone, the typeless line is the answer
    assert triage_lines(lines[:1]).root_cause == "Failed to load the fast tokenizer, an error occurred"


def test_the_cause_after_a_wrapper_wins():
    lines = [V1 + "EngineCore encountered a fatal error.", *TB, "RuntimeError: CUDA error: misaligned address",
             "ray.exceptions.RayTaskError(RuntimeError): ray::RayWorkerWrapper.execute_method() raised an exception"]
    res = triage_lines(lines)
    assert res.root_cause == "RuntimeError: CUDA error: misaligned address"


def test_an_exception_only_mentioned_at_info_yields_but_counts_with_its_own_stack():
    mention = "I0911 08:21:51.554457 1 pb_stub.cc:389] Failed to load plugin x: ImportError: no module named x"
    real = ('I0911 08:21:52.554457 1 pb_stub.cc:389] "Failed to initialize Python stub: AttributeError: '
            "'AsyncLLM' object has no attribute 'engine'\\n\\nAt:\\n"
            '  /opt/backends/vllm/model.py(365): _setup_metrics\\n"')
    assert triage_lines([mention, real]).root_cause == "AttributeError: 'AsyncLLM' object has no attribute 'engine'"
    assert triage_lines([mention]).root_cause == "ImportError: no module named x"


def test_teardown_noise_never_wins_and_alone_is_answered_honestly():
    teardown = ["Exception ignored in: <function LLM.__del__ at 0x7f2a>", "Traceback (most recent call last):",
                '  File "/v/entrypoints/llm.py", line 9, in __del__',
                "AttributeError: 'NoneType' object has no attribute 'shutdown'"]
    res = triage_lines([*TB, "ValueError: the real cause"] + teardown)
    assert res.root_cause == "ValueError: the real cause"
    alone = triage_lines(teardown)
    assert alone.outcome == "no-exception-found" and alone.root_cause is None and alone.signature is None
    assert "not in this log" in alone.next_step and "journalctl -k" in alone.next_step
    assert alone.evidence and alone.evidence[0]["why"].startswith("teardown")


@pytest.mark.parametrize("notice", [
    V1 + "Failed to import flash_attn, falling back to the xformers backend",
    'E1027 22:25:32.427556       1 proxy.go:268] "waiting for vLLM to be ready" err="dial tcp [::1]:8200: connect: '
    'connection refused"',
])
def test_fallback_notices_and_readiness_polls_are_not_causes(notice):
    assert triage_lines([notice]).root_cause is None
    res = triage_lines([notice, *TB, "RuntimeError: NCCL error: unhandled system error"])
    assert res.root_cause == "RuntimeError: NCCL error: unhandled system error"


# ------------------------------------------------------------------------------------------------ shapes
@pytest.mark.parametrize("line,level,text", [
    ("2025-12-04 21:57:21.581795+08:00 - gpustack.worker.backends.vllm - ERROR - Failed to start: x", "ERROR",
     "Failed to start: x"),
    ("[2026-01-14 18:54:21,503] DEBUG: router ready (utils.py:31:vllm_router.utils)", "DEBUG",
     "router ready (utils.py:31:vllm_router.utils)"),
    ("[2025-12-05 18:45:27,831] LMCache ERROR: transfer failed", "ERROR", "transfer failed"),
    ("2025-11-19 11:14:59.028 | ERROR    | __main__:doc_parse:95 | Dispatch error", "ERROR", "Dispatch error"),
    ("INFO 2024-11-18 01:46:34,210 default_VLLMDeployment ujj4diu5 replica.py:893 - Started", "INFO", "Started"),
    ("ERROR 02-13 18:05 [multiproc_executor.py:852] WorkerProc hit an exception.", "ERROR",
     "WorkerProc hit an exception."),
    ("2025-04-07T11:34:44-0700 [ERROR] [entry_service:Frontend:1] Frontend failed", "ERROR", "Frontend failed"),
    ("[ERROR] 2025-11-19-11:14:58 (PID:356, Device:0, RankID:-1) ERR00100 PTA call acl api failed", "ERROR",
     "ERR00100 PTA call acl api failed"),
    ("[ERROR] RUNTIME(129510,all__):2026-01-20-09:48:14.622.900 [stars_engine.cc:1502]133843 Task run failed", "ERROR",
     "Task run failed"),
    ("[Router (Rust)] 2025-03-18 14:17:58 - WARN - Removing failed worker", "WARNING", "Removing failed worker"),
    ("ms-pd-decode-6c8f9c4df6-vh88z vllm (APIServer pid=1) ERROR 10-27 22:25:30 [core.py:1] boom", "ERROR", "boom"),
    ("<14>1 2026-02-21T19:48:13.123Z gpu-a vllm 4100 - - ERROR 01-01 00:00:00 [x.py:1] boom", "ERROR", "boom"),
    ("Feb 21 20:16:57.123456 gpu-a vllm[4100]: ERROR 01-01 00:00:00 [x.py:1] boom", "ERROR", "boom"),
    ("| vllm_model | 1       | UNAVAILABLE: Internal: TypeError: x |", None, "TypeError: x"),
    ("│     Reason:       OOMKilled                 │", None, "Reason:       OOMKilled"),
    ("&lt;frozen runpy&gt; ERROR: &quot;boom&quot;", None, '<frozen runpy> ERROR: "boom"'),
    (json.dumps({"log": "ERROR 01-01 00:00:00 [x.py:1] boom\n", "stream": "stderr"}), "ERROR", "boom"),
    (json.dumps({"level": "error", "message": "engine died"}), "ERROR", "engine died"),
])
def test_pasted_shapes_become_records(line, level, text):
    rec = normalise([line])[0]
    assert (rec.level, rec.text.strip()) == (level, text)
