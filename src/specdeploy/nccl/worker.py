"""One rank of an all-reduce measurement (needs torch with CUDA and NCCL). Started by ``tune.py`` with
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT and the candidate's NCCL environment already set.

Rank 0 writes the result JSON, then every rank leaves with os._exit: destroying the process group after
CUDA-graph capture has been seen to hang for minutes, after the results are out.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time


def _pct(xs, q):
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _stats(samples_us):
    return {"median_us": statistics.median(samples_us), "p10_us": _pct(samples_us, 0.1),
            "p90_us": _pct(samples_us, 0.9), "n": len(samples_us)}


def main():
    import torch
    import torch.distributed as dist

    cfg = json.loads(sys.argv[1])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    hidden, iters, graph_ops = cfg["hidden"], cfg["iters"], cfg["graph_ops"]
    results = {"eager": {}, "graph": {}}
    x0 = torch.ones(1, device="cuda")
    dist.all_reduce(x0)  # connect
    torch.cuda.synchronize()
    for tokens in cfg["tokens"]:
        buf = torch.ones(tokens, hidden, dtype=torch.bfloat16, device="cuda")
        if "eager" in cfg["modes"]:
            for _ in range(5):
                dist.all_reduce(buf)
            torch.cuda.synchronize()
            samples = []
            for _ in range(iters):
                dist.barrier()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                dist.all_reduce(buf)
                e.record()
                e.synchronize()
                samples.append(s.elapsed_time(e) * 1000.0)
            results["eager"][str(tokens)] = _stats(samples)
        if "graph" in cfg["modes"]:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    dist.all_reduce(buf)
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(graph_ops):
                    dist.all_reduce(buf)
            torch.cuda.synchronize()
            g.replay()
            torch.cuda.synchronize()
            samples = []
            for _ in range(iters):
                dist.barrier()
                torch.cuda.synchronize()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                g.replay()
                e.record()
                e.synchronize()
                samples.append(s.elapsed_time(e) * 1000.0 / graph_ops)
            results["graph"][str(tokens)] = _stats(samples)
        # correctness: every element equals world size after one all-reduce of ones
        chk = torch.ones(tokens, hidden, dtype=torch.bfloat16, device="cuda")
        dist.all_reduce(chk)
        if not bool((chk == world).all()):
            results.setdefault("errors", []).append(f"wrong sum at {tokens} tokens")
        del buf
    if rank == 0:
        results["torch"] = torch.__version__
        results["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        results["device"] = torch.cuda.get_device_name()
        tmp = cfg["out"] + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(results, fh)
        os.replace(tmp, cfg["out"])
    sys.stdout.flush()
    time.sleep(0.2)
    os._exit(0)


if __name__ == "__main__":
    main()
