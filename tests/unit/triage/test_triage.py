"""Triage on real engine logs (tests/data/triage: each log as posted, with its URL and the thread's truth) and on
our own interleaved logs; the normaliser on every format; no traceback on any input."""
from __future__ import annotations

import fnmatch
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from specdeploy.testing.simulator import crash_log
from specdeploy.triage import normalise, read_log, triage_files, triage_lines
from helpers import TESTS

CORPUS = TESTS / "data" / "triage"
INDEX = yaml.safe_load((CORPUS / "index.yaml").read_text())["logs"]


def _run_corpus():
    out = []
    for entry in INDEX:
        t0 = time.perf_counter()
        res = triage_files([CORPUS / entry["file"]])
        out.append((entry, res, time.perf_counter() - t0))
    return out


@pytest.fixture(scope="module")
def corpus():
    return _run_corpus()


def test_corpus_is_complete_and_real():
    files = {p.name for p in CORPUS.glob("*.log")}
    assert files == {e["file"] for e in INDEX}, "every log has exactly one index entry"
    assert len(INDEX) >= 94
    for e in INDEX:
        assert e["url"].startswith("https://") and e["engine"] in ("vllm", "sglang"), e["file"]
        assert e["truth"] and e["fix"] and e["version"] and e["expected"]["outcome"], e["file"]
    # threads on GitHub, and a few pages that copy one (a log pasted from a web page)
    assert sum(not e["url"].startswith("https://github.com/") for e in INDEX) <= 5
    assert 3 <= sum(bool(e.get("held_out")) for e in INDEX) <= 10
    engines = {e["engine"] for e in INDEX}
    formats = {f for e in INDEX for f in e["formats"]}
    phases = {e["phase"] for e in INDEX}
    outcomes = {e["expected"]["outcome"] for e in INDEX}
    assert engines == {"vllm", "sglang"} and sum(e["engine"] == "sglang" for e in INDEX) >= 8
    assert {"vllm-v0", "vllm-v1", "ray", "docker-compose", "kubernetes-logging", "ansi-caret", "ansi-without-esc",
            "pasted-without-traceback", "pasted-flat", "chained-exception", "uvicorn-error", "kserve-logger",
            "stage-tag", "nccl-warn", "cann-error-record", "rocm", "exception-before-traceback",
            "ansi-escaped-text", "rust-panic", "native-abort", "cann-plog", "loguru", "quoted-json-escaped-newlines",
            "pod-container-prefix", "slurm-job-output", "web-page-copy", "worker-died", "glog", "sidecar-noise",
            "quoted-message-escaped-newlines", "error-logged-at-info", "typeless-error-first"} <= formats
    projects = {e["url"].split("/")[3] + "/" + e["url"].split("/")[4] for e in INDEX
                if e["url"].startswith("https://github.com/")}
    assert len(projects) >= 20, projects    # not only the engines' own trackers: forks, front-ends, schedulers
    assert {"weights", "kv-cache", "sampler", "cuda-graph", "nccl-init", "runtime", "shutdown"} <= phases
    assert outcomes == {"failed", "clean-shutdown", "killed", "no-exception-found"}


def _honest(e, r) -> bool:
    """A log with no cause in it: the answer names none, claims no known failure and says what to capture."""
    return r.root_cause is None and r.signature is None and bool(r.next_step) and r.outcome == e["expected"]["outcome"]


def test_corpus_metrics(corpus):
    with_root = [(e, r) for e, r, _ in corpus if e["expected"]["root"]]
    named = [e["file"] for e, r in with_root if r.root_cause and e["expected"]["root"] in r.root_cause]
    missed = sorted({e["file"] for e, _ in with_root} - set(named))
    no_root = [(e, r) for e, r, _ in corpus if not e["expected"]["root"]]
    dishonest = [(e["file"], r.outcome, r.root_cause) for e, r in no_root if not _honest(e, r)]
    confident_wrong = [(e["file"], r.signature) for e, r, _ in corpus if r.confidence == "high" and not (
        e["expected"]["signature"] and fnmatch.fnmatch(r.signature or "", e["expected"]["signature"]))]
    outcome_wrong = [(e["file"], r.outcome) for e, r, _ in corpus if r.outcome != e["expected"]["outcome"]]
    slow = [(e["file"], round(dt, 3)) for e, _, dt in corpus if dt >= 1.0]
    held = [e["file"] for e, *_ in corpus if e.get("held_out")]
    print(f"\ncorpus: {len(corpus)} logs; root named {len(named)}/{len(with_root)}; no-root honest "
          f"{len(no_root) - len(dishonest)}/{len(no_root)}; confident wrong {len(confident_wrong)}; outcome wrong "
          f"{len(outcome_wrong)}; held out {len(held)} (missed {sorted(set(missed) & set(held))}); slowest "
          f"{max(dt for *_, dt in corpus) * 1000:.0f} ms")
    assert len(corpus) >= 94
    assert len(named) >= 0.95 * len(with_root), missed
    assert not dishonest, dishonest
    assert not confident_wrong, confident_wrong
    assert not outcome_wrong, outcome_wrong
    assert not slow, slow


def test_unknown_answers_name_the_exception_and_the_next_step(corpus):
    for e, r, _ in corpus:
        if r.outcome in ("failed", "killed") and not r.signature:
            assert r.root_cause and r.next_step and r.fix.startswith("unknown"), e["file"]
        if r.signature:
            assert r.evidence and r.evidence[0]["text"] and r.confidence in ("high", "medium"), e["file"]
    nccl = next(r for e, r, _ in corpus if e["file"] == "sglang-4289-nccl-system-error.log")
    assert "NCCL_DEBUG=WARN" in nccl.next_step


def test_watchdog_that_caught_a_cuda_error_is_not_a_collective_timeout(corpus):
    r = next(r for e, r, _ in corpus if e["file"] == "vllm-8177-watchdog-illegal-access.log")
    assert r.root_cause == "CUDA error: an illegal memory access was encountered"
    assert r.signature is None and "CUDA_LAUNCH_BLOCKING=1" in r.next_step and r.rank == 0
    hang = next(r for e, r, _ in corpus if e["file"] == "vllm-8978-first-allreduce-hang.log")
    assert hang.signature == "nccl-first-collective-hang" and hang.confidence == "medium"


# ------------------------------------------------------------------------------------------------ normaliser
@pytest.mark.parametrize("line,proc,rank,ts,text", [
    ("(Worker_TP3 pid=251559) ERROR 02-21 20:16:57 [multiproc_executor.py:863] ValueError: x",
     "Worker_TP3", 3, "02-21 20:16:57", "ValueError: x"),
    ("(VllmWorkerProcess pid=235) ERROR 08-23 08:25:25 multiproc_worker_utils.py:226] RuntimeError: y",
     "VllmWorkerProcess", None, "08-23 08:25:25", "RuntimeError: y"),
    ("(VllmWorker rank=4 pid=555) ERROR 05-04 12:38:38 [multiproc_executor.py:380] Traceback (most recent call last):",
     "VllmWorker rank=4", 4, "05-04 12:38:38", "Traceback (most recent call last):"),
    ("\x1b[36m(RayWorkerWrapper pid=22477, ip=10.0.0.2)\x1b[0m ERROR 02-18 15:16:57 worker_base.py:575] KeyError: 'z'",
     "RayWorkerWrapper", None, "02-18 15:16:57", "KeyError: 'z'"),
    ("^[[36m(RayWorkerWrapper pid=22477, ip=)^[[0m ERROR 02-18 15:16:57 worker_base.py:575] KeyError: 'z'",
     "RayWorkerWrapper", None, "02-18 15:16:57", "KeyError: 'z'"),
    ("#033[0;36m(Worker_DP2_TP1_EP5 pid=16598)#033[0;0m ERROR 01-29 02:42:27 [multiproc_executor.py:749] E: 1^M",
     "Worker_DP2_TP1_EP5", 1, "01-29 02:42:27", "E: 1"),
    (" [36m(RayWorkerVllm pid=5085) [0m [E ProcessGroupNCCL.cpp:475] [Rank 4] Watchdog caught collective",
     "RayWorkerVllm", 4, None, "[Rank 4] Watchdog caught collective"),
    ("vllm-1  | ERROR 11-18 18:07:28 engine.py:366] ValueError: No available memory",
     None, None, "11-18 18:07:28", "ValueError: No available memory"),
    ("sglang-1  | [2025-11-01 16:50:36 TP1] Setup Custom allreduce failed", "TP1", 1, "2025-11-01 16:50:36",
     "Setup Custom allreduce failed"),
    ("[2026-06-13 01:26:10 DP6 TP6 EP6] Scheduler hit an exception: Traceback (most recent call last):",
     "DP6 TP6 EP6", 6, "2026-06-13 01:26:10", "Scheduler hit an exception:"),
    (("INFO 2025-11-19T20:16:36.096Z [resource.labels.containerName: vllm] (EngineCore_DP0 pid=270) ERROR 11-19 "
     "12:16:36 [v1/engine/core.py:842] torch.OutOfMemoryError: CUDA out of memory."),
     "EngineCore_DP0", None, "11-19 12:16:36", "torch.OutOfMemoryError: CUDA out of memory."),
    ("  | [2025-03-10T15:07:20Z] ERROR 03-10 08:07:20 [core.py:302] EngineCore hit an exception: x",
     None, None, "03-10 08:07:20", "EngineCore hit an exception: x"),
    ("Feb 21 20:16:57 gpu-a vllm[4100]: (Worker_TP0 pid=4100) ERROR 02-21 20:16:57 [x.py:1] OSError: e",
     "Worker_TP0", 0, "02-21 20:16:57", "OSError: e"),
    ("[rank2]:[E1001 16:06:04.537131842 ProcessGroupNCCL.cpp:607] [Rank 2] Watchdog caught", "rank2", 2,
     "1001 16:06:04.537131842", "[Rank 2] Watchdog caught"),
    ("(APIServer pid=1) ERROR 10-20 03:20:50 [serving_chat.py:1136[] Error in chat completion stream generator.",
     "APIServer", None, "10-20 03:20:50", "Error in chat completion stream generator."),
])
def test_normaliser_formats(line, proc, rank, ts, text):
    recs = normalise([line])
    first = recs[0]
    assert (first.proc, first.rank, first.ts, first.text.strip()) == (proc, rank, ts, text)


def test_sglang_traceback_starts_mid_line_and_continuations_inherit_the_rank():
    lines = ["[2025-02-26 12:01:56 TP3] sglang is using nccl==2.21.5",
             "[2025-02-26 12:01:56 TP2] Scheduler hit an exception: Traceback (most recent call last):",
             '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 1816, in run_scheduler',
             "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, dp_rank)",
             "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)",
             "",
             "[2025-02-26 12:01:57] Received sigquit from a child process. It usually means the child failed."]
    recs = normalise(lines)
    assert [r.text for r in recs if r.n == 2] == ["Scheduler hit an exception:", "Traceback (most recent call last):"]
    assert {(r.proc, r.rank) for r in recs if r.n in (3, 4, 5)} == {("TP2", 2)}
    res = triage_lines(lines)
    assert res.root_cause.startswith("RuntimeError: NCCL error") and res.worker == "TP2" and res.rank == 2
    assert res.location.endswith("scheduler.py:1816") and res.timestamp == "2025-02-26 12:01:56"


def test_config_dumps_are_data_never_evidence():
    dump = ("INFO 02-21 19:40:01 [core.py:97] Initializing a V1 LLM engine (v0.16.0) with config: "
            "model='/shared/kimi-k2.5-int4', trust_remote_code=True, dtype=torch.bfloat16, "
            "speculative_config=SpeculativeConfig(method='eagle3')")
    p = "(Worker_TP0 pid=1) ERROR 02-21 20:16:57 [multiproc_executor.py:863] "
    lines = [dump, "INFO 02-21 19:40:02 [api_server.py:1] args: Namespace(trust_remote_code=True, port=8000)",
             p + "Traceback (most recent call last):", p + '  File "/x/fused_moe/layer.py", line 1432, in f',
             p + "ValueError: expert map shape (96,) does not match local experts 48",
             "RuntimeError: Engine core initialization failed. See root cause above."]
    res = triage_lines(lines)
    assert res.signature is None and res.root_cause.startswith("ValueError: expert map")
    assert triage_lines([dump]).outcome == "no-exception-found"


def test_worker_failed_with_error_is_unwrapped():
    lines = ["ERROR 03-01 10:00:00 [core.py:1] EngineCore encountered a fatal error.",
             "Traceback (most recent call last):",
             '  File "/opt/vllm/v1/executor/multiproc_executor.py", line 250, in collective_rpc',
             "    raise RuntimeError(",
             ("RuntimeError: Worker failed with error 'CUDA error: an illegal memory access was encountered', please "
             "check the stack trace above for the root cause")]
    res = triage_lines(lines)
    assert res.root_cause == "CUDA error: an illegal memory access was encountered"
    assert "CUDA_LAUNCH_BLOCKING=1" in res.next_step


def test_clean_shutdowns_are_not_failures():
    lines = ["INFO:     Shutting down", "INFO:     Waiting for application shutdown.",
             "(APIServer pid=9) Traceback (most recent call last):",
             '(APIServer pid=9)   File "/usr/lib/python3.12/asyncio/runners.py", line 118, in run',
             "(APIServer pid=9) KeyboardInterrupt",
             "INFO:     Application shutdown complete.", "INFO:     Finished server process [9]"]
    res = triage_lines(lines)
    assert res.outcome == "clean-shutdown" and res.root_cause is None and res.fix is None
    journal = ["Stopping specdeploy-vllm.service - vLLM...", ("(APIServer pid=9) INFO 02-21 20:00:00 [launcher.py:1] "
               "Shutting down FastAPI HTTP server."), "specdeploy-vllm.service: Deactivated successfully."]
    assert triage_lines(journal).outcome == "clean-shutdown"


def test_silent_kill_is_named_and_the_kernel_log_is_its_evidence():
    unit = ["(Worker_TP2 pid=4102) INFO 02-21 19:48:12 [default_loader.py:291] Loading weights took 12.4 seconds",
            "specdeploy-vllm.service: Main process exited, code=killed, status=9/KILL",
            "specdeploy-vllm.service: Failed with result 'signal'."]
    res = triage_lines(unit)
    assert res.outcome == "killed" and "SIGKILL" in res.root_cause and res.signature is None
    assert "journalctl -k" in res.next_step
    kernel = ["2026-02-21T19:48:13+0000 gpu-a kernel: python3 invoked oom-killer: gfp_mask=0x140cca, order=0",
              ("2026-02-21T19:48:13+0000 gpu-a kernel: Out of memory: Killed process 4100 (python3) "
               "total-vm:2119912kB, anon-rss:1802400000kB, file-rss:0kB")]
    res = triage_lines(unit, kernel)
    assert res.outcome == "killed" and res.signature == "host-oom-killer" and res.confidence == "high"
    assert any("Killed process 4100" in e["text"] for e in res.evidence)


@pytest.mark.parametrize("line,needle", [
    ("OSError: [Errno 28] No space left on device", "HF_HOME"),
    (("OSError: /models/kimi does not appear to have a file named config.json. Checkout 'https://huggingface.co/"
     "/models/kimi/tree/None' for available files."), "specdeploy preflight"),
    (("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
     "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5"), "NCCL_DEBUG=WARN"),
])
def test_unknown_failures_say_where_to_look(line, needle):
    res = triage_lines(["Traceback (most recent call last):", '  File "/x/y.py", line 1, in f', line])
    assert res.signature is None and res.root_cause == line and needle in res.next_step


@pytest.mark.parametrize("lines,outcome,signature,needle", [
    (["vllm-1  | INFO 01-01 00:00:00 [x.py:1] Loading weights", "vllm-1 exited with code 137"], "killed", None,
     "SIGKILL"),
    (["vllm-1 exited with code 1"], "failed", None, "code 1"),
    (["Fatal Python error: Segmentation fault", "", "Current thread 0x00007f (most recent call first):"], "killed",
     None, "SIGSEGV"),
    (["specdeploy-vllm.service: start operation timed out. Terminating.",
      "specdeploy-vllm.service: Failed with result 'timeout'."], "killed", "systemd-start-timeout", "timed out"),
    (["Stopping specdeploy-vllm.service - vLLM...",
      "specdeploy-vllm.service: Main process exited, code=killed, status=15/TERM"], "clean-shutdown", None, None),
    (["    Last State:     Terminated", "      Reason:       OOMKilled", "      Exit Code:    137"], "killed",
     "host-oom-killer", "OOMKilled"),
    (["terminate called after throwing an instance of 'c10::Error'", "  what():  CUDA error: misaligned address"],
     "failed", None, "CUDA error: misaligned address"),
    (["ray.exceptions.RayTaskError(ValueError): ray::RayWorkerWrapper.execute_method() (pid=1, ip=10.0.0.2)",
      '  File "/opt/vllm/worker/worker.py", line 12, in load_model', "ValueError: shape mismatch in layer 3"],
     "failed", None, "ValueError: shape mismatch"),
])
def test_how_the_process_ended(lines, outcome, signature, needle):
    res = triage_lines(lines)
    assert (res.outcome, res.signature) == (outcome, signature)
    assert needle is None or needle in res.root_cause


def test_readme_examples_are_the_real_output(repo):
    """The README's triage examples are real corpus logs; their printed output must be what the CLI prints."""
    import re
    text = (repo / "README.md").read_text()
    blocks = re.findall(r"```text\n\$ specdeploy triage (\S+)\n(.*?)```", text, re.DOTALL)
    assert len(blocks) >= 2 and {b[0].split("-")[0] for b in blocks} >= {"vllm", "sglang"}
    for name, shown in blocks:
        assert any(e["file"] == name for e in INDEX), name
        r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "triage", str(CORPUS / name)], check=False,
                           capture_output=True, text=True)
        for line in shown.strip().splitlines():
            head = line.split("[...]")[0]
            assert any(out.startswith(head) for out in r.stdout.splitlines()), (name, line)


def test_a_journal_across_restarts_is_triaged_by_its_latest_run():
    old = ["Started specdeploy-vllm.service - vLLM.",
           "(APIServer pid=7) INFO 02-20 10:00:00 [api_server.py:1] vLLM API server version 0.16.0",
           "Traceback (most recent call last):", '  File "/x/api_server.py", line 5, in run',
           "OSError: [Errno 98] Address already in use"]
    new = ["Started specdeploy-vllm.service - vLLM.",
           "(APIServer pid=9) INFO 02-21 10:00:00 [api_server.py:1] vLLM API server version 0.16.0"]
    new += crash_log("vllm", "0.16.0", "/m", 3, 2).splitlines()
    assert triage_lines(old + new).signature == "kimi-image-token-index"
    # the latest run shows nothing yet (still loading): the previous run's ending is the answer
    assert triage_lines(old + new + ["Started specdeploy-vllm.service - vLLM.", "Loading weights 10%"]).signature \
        == "kimi-image-token-index"
    stopped = ["Stopping specdeploy-vllm.service - vLLM...", "INFO:     Shutting down",
               "specdeploy-vllm.service: Deactivated successfully."]
    assert triage_lines(old + new + stopped).outcome == "failed"  # the stop belongs to the failed run's unit
    assert triage_lines(old + new + ["Started specdeploy-vllm.service - vLLM."] + stopped).outcome == "clean-shutdown"


# ------------------------------------------------------------------------------------------------ our own logs
@pytest.mark.parametrize("log,sig,needle", [
    ("vllm-image-token.log", "kimi-image-token-index", "image_token_index"),
    ("vllm-eagle3-interface.log", "eagle3-interface-missing", "EAGLE3 interface"),
    ("vllm-oom.log", "cuda-oom*", "CUDA out of memory"),
])
def test_triage_finds_root_cause_in_interleaved_logs(repo, log, sig, needle):
    res = triage_files([repo / "tests/data/logs" / log])
    assert fnmatch.fnmatch(res.signature, sig) and needle in res.root_cause and res.outcome == "failed"
    assert res.worker.startswith("Worker_TP") and res.fix and res.rank is not None
    assert "Engine core initialization failed" not in res.root_cause
    assert res.location and ".py:" in res.location


def test_triage_unknown_failure_is_verbatim(repo):
    res = triage_files([repo / "tests/data/logs/vllm-unknown.log"])
    assert res.signature is None
    assert res.root_cause == "ValueError: expert map shape (96,) does not match local experts 48"
    assert res.location.endswith("fused_moe/layer.py:1432")


@pytest.mark.parametrize("line,sig", [
    ("ValueError: Eagle3 is only supported for ['llama', 'qwen', 'minicpm', 'gpt_oss'] models. Got kimi_k2",
     "eagle3-target-whitelist"),
    ("TypeError: SchedulerConfig.__init__() missing 1 required keyword-only argument: 'is_encoder_decoder'",
     "scheduler-is-encoder-decoder"),
    ("ValueError: Loading /shared/kimi-k2.5-int4 requires you to execute the configuration file in that repo on your "
     "local machine. Make sure you have read the code there to avoid malicious use, then set the option "
     "`trust_remote_code=True` to remove this error.", "trust-remote-code"),
    ("ValueError: Model KimiK25ForConditionalGeneration does not support EAGLE3 hidden state capture "
     "(supports_eagle3 is False)", "speculators-supports-eagle3"),
])
def test_triage_signatures(line, sig):
    p = "(Worker_TP0 pid=1) ERROR 02-21 20:16:57 [multiproc_executor.py:863] "
    lines = [p + "Traceback (most recent call last):", p + '  File "/x/custom_worker.py", line 103, in f',
             p + "    raise ValueError(", p + line,
             "RuntimeError: Engine core initialization failed. See root cause above."]
    res = triage_lines(lines)
    assert res.signature == sig and res.confidence == "high" and res.evidence[0]["line"] == 4


@pytest.mark.parametrize("tp", [1, 4, 8])
def test_simulator_crash_logs_triage_in_both_engine_formats(tp):
    sg = triage_lines(crash_log("sglang", "0.5.10", "/models/kimi", 3, tp).splitlines())
    assert sg.outcome == "failed" and sg.signature == "sglang-custom-allreduce-pcie" and sg.confidence == "high"
    assert sg.worker.startswith("TP") and sg.rank is not None and "CustomAllReduceV2" in sg.root_cause
    assert sg.location.endswith("cuda_graph_runner.py:381")
    vl = triage_lines(crash_log("vllm", "0.16.0", "/models/kimi", 3, tp).splitlines())
    assert vl.signature == "kimi-image-token-index" and vl.worker.startswith("Worker_TP")


# ------------------------------------------------------------------------------------------------ robustness
def test_no_input_makes_triage_raise():
    rng = random.Random(7)
    real = [read_log(CORPUS / e["file"]) for e in INDEX]
    cases: list[list] = [[], [""], ["\x00" * 100], ["(" * 5000], ["Traceback (most recent call last):"] * 3,
                         ["[" + "0;" * 3000 + "m"], ["(Worker pid=1) " * 2000], [b"\xff\xfe\x00bytes"]]
    for _ in range(200):
        cases.append(bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 400)))
                     .decode("utf-8", "replace").splitlines())
    for lines in real:
        for _ in range(4):   # truncated anywhere, lines cut mid-way, shuffled
            a, b = sorted(rng.randint(0, len(lines)) for _ in range(2))
            cut = [ln[: rng.randint(0, len(ln))] for ln in lines[a:b]]
            cases.append(cut)
            cases.append(rng.sample(lines, len(lines)))
    for lines in cases:
        res = triage_lines(lines)
        assert res.outcome in ("failed", "clean-shutdown", "killed", "no-exception-found")
        json.dumps(res.to_dict())


def test_cli_never_prints_a_traceback(tmp_path):
    rng = random.Random(3)
    binary = tmp_path / "binary.log"
    binary.write_bytes(bytes(rng.getrandbits(8) for _ in range(200_000)))
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    huge = tmp_path / "huge.log"
    one = (CORPUS / "vllm-7801-v0-flattened-nccl.log").read_text()
    huge.write_text("(Worker_TP1 pid=7) INFO 02-21 19:48:12 [default_loader.py:291] Loading weights took 1 s\n"
                    * 100_000 + one)
    long_line = tmp_path / "long-line.log"
    long_line.write_bytes(b"x" * (5 << 20) + b"\n" + (CORPUS / "vllm-7801-v0-flattened-nccl.log").read_bytes())
    utf16 = tmp_path / "utf16.log"
    utf16.write_bytes((CORPUS / "vllm-5244-trust-remote-code-chained.log").read_text().encode("utf-16"))
    base = [sys.executable, "-m", "specdeploy.cli", "triage"]
    env = dict(os.environ)
    for args, rc in [([binary], 1), ([empty], 1), ([tmp_path / "missing.log"], 2), ([tmp_path], 2), ([], 2),
                     ([utf16, "--json"], 0), ([huge], 0), ([long_line], 0),
                     (["--kernel-log", tmp_path / "nope", empty], 2)]:
        t0 = time.perf_counter()
        r = subprocess.run(base + [str(a) for a in args], check=False, capture_output=True, text=True, env=env)
        assert "Traceback" not in r.stderr and r.returncode == rc, (args, r.stderr[-500:])
        if rc == 2:
            assert "Fix:" in r.stderr
        if args and args[0] in (huge, long_line):
            assert "NCCL error: unhandled system error" in r.stdout and time.perf_counter() - t0 < 60
        if "--json" in args:
            assert json.loads(r.stdout)["signature"] == "trust-remote-code"


def test_cli_journal_reads_the_unit_and_the_kernel_log(tmp_path):
    """--journal runs journalctl for the unit and for the kernel (OOM-kill evidence); a stub journalctl on PATH
    stands in for systemd here, the sandbox tests run the real one."""
    stub = tmp_path / "journalctl"
    stub.write_text("#!/bin/sh\ncase \"$*\" in\n"
                    "  *-k*) echo '2026-02-21T19:48:13+0000 gpu-a kernel: Out of memory: Killed process 4100 (python3) "
                    "total-vm:2119912kB, anon-rss:1802400000kB';;\n"
                    "  *) echo 'Loading safetensors checkpoint shards:  41% Completed | 26/64';"
                    " echo 'specdeploy-vllm.service: Main process exited, code=killed, status=9/KILL';;\nesac\n")
    stub.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "triage", "--journal", "specdeploy-vllm.service",
                        "--json"], check=False, capture_output=True, text=True, env=env)
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["outcome"] == "killed" and out["signature"] == "host-oom-killer"
    assert any("Killed process 4100" in e["text"] for e in out["evidence"])


# ------------------------------------------------------------------------------------------------ evidence kinds
V1 = "(EngineCore_DP0 pid=270) ERROR 11-19 12:16:36 [core.py:842] "


@pytest.mark.parametrize("lines,outcome,root,signature", [
    # uvicorn's own error line, then its routine shutdown: a failed start, not an operator stop
    (["INFO:     Started server process [593]", "INFO:     Waiting for application startup.",
      "INFO:     Application startup complete.",
      "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use",
      "INFO:     Waiting for application shutdown.", "INFO:     Application shutdown complete."],
     "failed", "address already in use", "port-in-use"),
    # an ERROR record with no exception type
    (["2024-07-01 07:28:04.488 1 kserve ERROR [__main__.py:<module>():254] Failed to start model server: integer "
      "division or modulo by zero"], "failed", "Failed to start model server: integer division or modulo by zero",
     None),
    # the device-side assertion, not the RuntimeError it surfaces as
    (["../aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [0,0,0], thread: [64,0,0] Assertion "
      "`-sizes[i] <= index && index < sizes[i] && \"index out of bounds\"` failed.",
      V1 + "Traceback (most recent call last):", V1 + '  File "/v/gpu_model_runner.py", line 1499, in execute_model',
      V1 + "RuntimeError: CUDA error: device-side assert triggered"], "failed", "index out of bounds", None),
    # NCCL's warning, then a traceback cut before its exception
    (["h100-15:139:1092 [7] socket.c:485 NCCL WARN socketStartConnect: Connect to 10.0.0.82<38455> failed : Software "
      "caused connection abort", "h100-15:139:1092 [7] NCCL INFO transport/net.cc:687 -> 2",
      "[2025-04-21 07:28:41 TP0] Scheduler hit an exception: Traceback (most recent call last):",
      '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 1714, in run_scheduler_process'],
     "failed", "socketStartConnect: Connect to 10.0.0.82<38455> failed", "nccl-socket-connect"),
    # a worker's message that spans lines, unwrapped
    ([V1 + "Traceback (most recent call last):", V1 + '  File "/v/multiproc_executor.py", line 250, in collective_rpc',
      V1 + "RuntimeError: Worker failed with error 'CUDA error: an illegal memory access was encountered",
      V1 + "CUDA kernel errors might be asynchronously reported at some other API call',",
      V1 + "please check the stack trace above for the root cause"],
     "failed", "CUDA error: an illegal memory access was encountered", None),
    # CUDA's driver OOM is an OOM
    (["Traceback (most recent call last):", '  File "/v/model_loader/default_loader.py", line 12, in load_weights',
      "RuntimeError: CUDA driver error: out of memory"], "failed", "CUDA driver error: out of memory", "cuda-oom-*"),
    # HCCL's bound port: port-in-use, its evidence the line that says so
    (["[rank0]: RuntimeError: createHCCLComm:compiler_depend.ts:1479 HCCL function error: HcclGetRootInfo(&hcclID), "
      "error code is 11",
      "[rank0]: EJ0003: [PID: 159] 2025-03-26-17:01:02.816.428 Failed to bind the IP port. Reason: The IP address and "
      "port have been bound already."], "failed", "HcclGetRootInfo", "port-in-use"),
    # an architecture the kernels were not built for, in the words of a ROCm build
    (["RuntimeError: One of GPU archs of ['gfx1151'] is invalid or not supported with VLLM_ROCM_USE_AITER: 1"],
     "failed", "gfx1151", "gpu-arch-unsupported"),
    # a collective timeout, then the watchdog's SIGABRT: the timeout
    (["[rank1]:[E1001 16:06:04.537 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective operation timeout: "
      "WorkNCCL(SeqNum=5210, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600054 milliseconds "
      "before timing out.", "[rank1]:[E1001 16:06:04.538 ProcessGroupNCCL.cpp:1664] [PG 0 Rank 1] Timeout at NCCL work",
      "Fatal Python error: Aborted", "vllm-1 exited with code 134"],
     "failed", "Watchdog caught collective operation timeout", "nccl-collective-timeout"),
    # a GPU fault, then the abort
    ([":0:rocdevice.cpp            :3586: 1183357978 us:  Callback: Queue 0x7f35e8100000 aborting with error : "
      "HSA_STATUS_ERROR_EXCEPTION: An HSAIL operation resulted in a hardware exception. code: 0x1016",
      "Fatal Python error: Aborted"], "failed", "HSA_STATUS_ERROR_EXCEPTION", None),
])
def test_every_kind_of_evidence_can_be_the_root(lines, outcome, root, signature):
    res = triage_lines(lines)
    assert res.outcome == outcome and root in res.root_cause, res
    assert fnmatch.fnmatch(res.signature or "", signature) if signature else res.signature is None, res.signature


def test_a_signature_names_the_line_that_is_its_evidence():
    lines = ["[rank0]: RuntimeError: HCCL function error: HcclGetRootInfo(&hcclID), error code is 11",
             "[rank0]: [ERROR] 2025-03-26-17:01:03 (PID:159, Device:0, RankID:-1) ERR02200 DIST call hccl api failed.",
             "[rank0]: EJ0003: [PID: 159] 2025-03-26-17:01:02.816.428 Failed to bind the IP port. Reason: The IP "
             "address and port have been bound already."]
    res = triage_lines(lines)
    assert [e["line"] for e in res.evidence] == [1, 3] and "bound already" in res.evidence[1]["text"]
    assert res.confidence == "medium"


def test_an_exception_logged_before_its_traceback_keeps_the_traceback_as_its_location():
    lines = ["ERROR 03-21 05:22:24 engine.py:244] AssertionError()",
             "ERROR 03-21 05:22:24 engine.py:244] Traceback (most recent call last):",
             'ERROR 03-21 05:22:24 engine.py:244]   File "/v/engine/multiprocessing/engine.py", line 242, in start',
             "ERROR 03-21 05:22:24 engine.py:244]     self.run_engine_loop()",
             'ERROR 03-21 05:22:24 engine.py:244]   File "/v/spec_decode/spec_decode_worker.py", line 88, in step',
             "ERROR 03-21 05:22:24 engine.py:244]     assert x"]
    res = triage_lines(lines)
    assert res.root_cause == "AssertionError()" and res.location == "/v/spec_decode/spec_decode_worker.py:88"


@pytest.mark.parametrize("prefix", ["[core.py:720] ", "(EngineCore_DP0 pid=1) [core.py:720] ",
                                    "(APIServer pid=1) [Stage-1] ERROR 01-29 19:03:10 [omni_stage.py:1400] ",
                                    "2024-07-01 07:28:04.488 1 kserve ERROR [model_server.py:<lambda>():101] "])
def test_header_forms_without_level_or_time(prefix):
    lines = [prefix + "Traceback (most recent call last):", prefix + '  File "/v/worker.py", line 7, in load_model',
             prefix + "ValueError: expert map shape (96,) does not match local experts 48"]
    res = triage_lines(lines)
    assert res.root_cause == "ValueError: expert map shape (96,) does not match local experts 48"
    assert res.location == "/v/worker.py:7"


LOAD = ["(APIServer pid=1) INFO 05-08 00:41:35 [api_server.py:1043] vLLM API server version 0.8.5",
        "(EngineCore_0 pid=90) INFO 05-08 00:41:37 [gpu_model_runner.py:1329] Starting to load model /m...",
        "Loading safetensors checkpoint shards:  41% Completed | 26/64 [03:10<04:30,  7.32s/it]"]


def test_an_interrupt_during_the_load_is_a_clean_shutdown_that_points_at_the_start_timeout():
    lines = LOAD + ["(VllmWorker rank=0 pid=120) INFO 05-08 00:44:51 [multiproc_executor.py:425] WorkerProc was "
                    "terminated",
                    "(EngineCore_0 pid=90) ERROR 05-08 00:44:51 [core.py:396] EngineCore failed to start.",
                    "(EngineCore_0 pid=90) ERROR 05-08 00:44:51 [core.py:396] Traceback (most recent call last):",
                    '(EngineCore_0 pid=90) ERROR 05-08 00:44:51 [core.py:396]   File "/v/core.py", line 71, in i',
                    "(EngineCore_0 pid=90) ERROR 05-08 00:44:51 [core.py:396] Exception: WorkerProc initialization "
                    "failed due to an exception in a background process. See stack trace for root cause.",
                    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"]
    res = triage_lines(lines)
    assert res.outcome == "clean-shutdown" and res.root_cause is None
    assert "start timeout" in res.next_step and "startupProbe" in res.next_step
    after = [ln.replace("Loading safetensors", "Loaded") for ln in LOAD] + [
        "(APIServer pid=1) INFO:     Application startup complete.", "(APIServer pid=1) INFO:     Shutting down"]
    assert "start timeout" not in triage_lines(after).next_step      # stopped once it was up: nothing to say


def test_sigterm_during_the_load_names_the_start_timeout_and_routine_lines_are_not_a_stop():
    res = triage_lines(LOAD + ["vllm-1 exited with code 143"])
    assert res.outcome == "killed" and res.signature == "start-timeout-likely" and res.confidence == "medium"
    res = triage_lines(["INFO:     Waiting for application shutdown.", "INFO:     Application shutdown complete.",
                        "INFO:     Finished server process [1]"])
    assert res.outcome == "no-exception-found" and "without saying why" in res.next_step


# ------------------------------------------------------------------------------------------------ large logs
# the child's own peak (VmHWM, in kB): ru_maxrss would carry the forking parent's high-water mark across exec
_PEAK = ("import re, sys\nfrom specdeploy.triage import triage_files\nr = triage_files([sys.argv[1]])\n"
         "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)\n"
         "print(r.evidence[0]['line'], r.root_cause[:40], hwm)")


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads the peak from /proc")
def test_a_large_log_is_read_in_bounded_memory_with_its_own_line_numbers(tmp_path):
    """A 20 MB and a 40 MB log cost the same memory (the middle is counted, never kept), and the answer's line
    numbers are the file's. bench/bench_triage_large.py times a 200 MB one."""
    crash = (CORPUS / "vllm-7801-v0-flattened-nccl.log").read_bytes()
    root_line = next(i for i, ln in enumerate(crash.decode().splitlines(), 1) if "NCCL error" in ln)
    line = b"(Worker_TP1 pid=7) INFO 02-21 19:48:12 [default_loader.py:291] Loading weights took 1.02 seconds\n"
    peaks = {}
    for mb in (20, 40):
        path = tmp_path / f"{mb}.log"
        count = mb * (1 << 20) // len(line)
        with open(path, "wb") as fh:
            for _ in range(count // 1000):
                fh.write(line * 1000)
            fh.write(line * (count % 1000))
            fh.write(crash)
        r = subprocess.run([sys.executable, "-c", _PEAK, str(path)], capture_output=True, text=True, check=True)
        n, *_, rss = r.stdout.split()
        assert "NCCL error" in r.stdout and int(n) == count + root_line, r.stdout
        peaks[mb] = int(rss) // 1024
        path.unlink()
    assert peaks[40] - peaks[20] < 16 and peaks[40] < 256, peaks


def test_window_is_bounded_and_keeps_line_numbers():
    from specdeploy.triage import HEAD_BYTES, TAIL_BYTES, window
    kept = window(f"line {i} " + "x" * 200 for i in range(1, 200_001))
    assert sum(len(s) for _, s in kept) <= HEAD_BYTES + TAIL_BYTES + 2 * 220
    assert kept[0] == (1, "line 1 " + "x" * 200) and kept[-1][0] == 200_000 and kept[-1][1].startswith("line 200000 ")
