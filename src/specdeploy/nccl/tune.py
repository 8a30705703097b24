"""``specdeploy nccl tune``: run every candidate environment in fresh, killable processes."""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specdeploy.nccl import DECODE_TOKENS, PREFILL_TOKENS

# Variables the lender of the GPU machine requires to stay as they are (NVLink multicast off).
PRESERVED = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_candidate(name: str, env_add: dict[str, str], gpus: int, hidden: int, tokens, modes,
                  iters: int, graph_ops: int, timeout: float, port_retries: int = 2) -> dict:
    """One measurement in fresh processes. A rendezvous port taken between choosing and binding it (seen on
    the GPU machine: EADDRINUSE) is the harness's fault, not the candidate's: that run is repeated."""
    for attempt in range(port_retries + 1):
        rec = _run_once(name, env_add, gpus, hidden, tokens, modes, iters, graph_ops, timeout)
        if rec["status"] != "crash" or "EADDRINUSE" not in rec.get("log_tail", ""):
            break
    if attempt:
        rec["port_retries"] = attempt
    return rec


def _run_once(name: str, env_add: dict[str, str], gpus: int, hidden: int, tokens, modes,
              iters: int, graph_ops: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as td:
        out = os.path.join(td, "result.json")
        cfg = {"hidden": hidden, "tokens": list(tokens), "modes": list(modes), "iters": iters,
               "graph_ops": graph_ops, "out": out}
        port = _free_port()
        procs = []
        base = {k: v for k, v in os.environ.items() if not (k.startswith("NCCL_") and k not in PRESERVED)}
        base.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        logs = []
        t0 = time.monotonic()
        for rank in range(gpus):
            env = dict(base, RANK=str(rank), WORLD_SIZE=str(gpus), LOCAL_RANK=str(rank),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **env_add)
            log = open(os.path.join(td, f"rank{rank}.log"), "w+")
            logs.append(log)
            procs.append(subprocess.Popen([sys.executable, "-m", "specdeploy.nccl.worker", json.dumps(cfg)],
                                          env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        status, detail = "ok", ""
        while True:
            if os.path.exists(out) and all(p.poll() is not None for p in procs):
                break
            if os.path.exists(out) and time.monotonic() - t0 > timeout:
                break  # results are out; a teardown hang is not a failure
            if any(p.poll() not in (None, 0) for p in procs):
                status, detail = "crash", f"rank exit codes {[p.poll() for p in procs]}"
                break
            if all(p.poll() == 0 for p in procs) and not os.path.exists(out):
                status, detail = "crash", "ranks exited without a result"
                break
            if time.monotonic() - t0 > timeout:
                status, detail = "timeout", f"no result after {timeout:.0f} s"
                break
            time.sleep(0.2)
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in procs:
            p.wait()
        tail = ""
        if status != "ok":
            for log in logs:
                log.seek(0)
            tail = "\n".join(log.read()[-2000:] for log in logs)[-4000:]
        for log in logs:
            log.close()
        rec = {"name": name, "env": env_add, "status": status, "seconds": round(time.monotonic() - t0, 1)}
        if status == "ok":
            with open(out) as fh:
                res = json.load(fh)
            rec.update(res)
            if res.get("errors"):
                rec["status"] = "wrong-result"
        else:
            rec["detail"] = detail
            rec["log_tail"] = tail
        return rec


AA_NAME = "default-aa"  # a second, independent run of the default in every round: the A/A control


def tune(candidates: dict[str, dict[str, str]], gpus: int, hidden: int, out: Path,
         tokens=DECODE_TOKENS + PREFILL_TOKENS, modes=("eager", "graph"), iters: int = 50,
         graph_ops: int = 10, timeout: float = 180.0, base_env: dict[str, str] | None = None,
         label: str = "", progress=None, rounds: int = 1, seed: int | None = None, aa: bool = True) -> dict:
    """Measure every candidate in each of ``rounds`` rounds, in an order shuffled per round; the default (and,
    with ``aa``, a second default run as the A/A control) runs in every round. ``base_env`` is added to every
    candidate (e.g. NCCL_P2P_DISABLE=1). The file is rewritten after each round, so finished rounds survive."""
    base_env = base_env or {}
    cands = {"default": {}, **candidates}
    if aa:
        cands[AA_NAME] = dict(cands["default"])
    seed = seed if seed is not None else random.SystemRandom().randrange(2 ** 31)
    rng = random.Random(seed)
    from specdeploy.values.outputs import JSON_MARK, json_marked, write_file
    result = {"format": 2, JSON_MARK: TUNE_CMD, "gpus": gpus, "hidden": hidden, "dtype": "bfloat16",
              "tokens": list(tokens), "modes": list(modes), "base_env": base_env, "label": label,
              "host": socket.gethostname(), "seed": seed, "rounds": []}
    for r in range(rounds):
        order = list(cands)
        rng.shuffle(order)
        runs = []
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for name in order:
            merged = {**base_env, **cands[name]}
            if progress:
                progress(name, "start", r)
            rec = run_candidate(name, merged, gpus, hidden, tokens, modes, iters, graph_ops, timeout)
            runs.append(rec)
            if progress:
                progress(name, rec["status"], r)
        result["rounds"].append({"round": r + 1, "started": started, "order": order, "candidates": runs})
        # the output rule (values.outputs): written beside and renamed in; only an earlier results file is replaced
        write_file(out, json.dumps(result, indent=1), "--out", TUNE_CMD, json_marked(TUNE_CMD),
                   "a new JSON file path for the results")
    return result


TUNE_CMD = "nccl tune"
