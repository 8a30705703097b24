"""What only a GPU shows of a weight-cache daemon: how long an engine takes to map one rank's weights that another
process holds, over CUDA IPC, and what that costs in GPU memory.

Both engines' daemons share their tensors the same way: PyTorch's `reduce_tensor` turns each CUDA tensor into an IPC
handle, the handles go over a Unix socket, the engine rebuilds each with `rebuild_cuda_tensor` (vLLM 0.32.0's
weight_cache/protocol.py `TensorEntry`; SGLang 0.5.23's weight_cache/transport.py). This bench plays that with
PyTorch alone (no engine): a holder process fills `--gib` of GPU memory in `--tensors` tensors (one rank's shard of a
checkpoint: a 600 GB checkpoint over 8 GPUs is 75 GB a rank) and serves their handles; an attacher process, started
fresh each time as an engine is, connects, rebuilds every tensor, checks a sample against the holder's fingerprints,
and reports its times and the GPU's free memory before and after. Then the holder is killed with SIGKILL while an
attacher still maps its tensors, and the attacher reads them again (does an engine keep serving when its daemon dies?).
Last, for comparison, a plain host-to-GPU copy of `--h2d-gib` (the floor of a load from the page cache).

    python3 bench/ipc_attach.py --gib 75 --tensors 1500 --attaches 3 --json out.json

Needs a CUDA GPU and PyTorch; it refuses to run without one. Nothing here is imported by specdeploy."""
from __future__ import annotations

import argparse
import json
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

MAX_MSG = 64 << 20  # handles are ~100 bytes each; a bound on what the attacher will read
SAMPLE = 16  # tensors whose contents are checked on every attach


def _send(sock: socket.socket, obj) -> None:
    data = pickle.dumps(obj)
    sock.sendall(struct.pack("!Q", len(data)) + data)


def _recv(sock: socket.socket):
    head = _exact(sock, 8)
    (n,) = struct.unpack("!Q", head)
    if n > MAX_MSG:
        raise SystemExit(f"message of {n} bytes is over the bound of {MAX_MSG}")
    return pickle.loads(_exact(sock, n))  # noqa: S301 - our own holder, same uid, private socket dir


def _exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise SystemExit("holder closed the socket")
        buf += chunk
    return bytes(buf)


def _fingerprint(t) -> int:
    import torch
    return int(t.view(torch.int32).sum(dtype=torch.int64).item())


def holder(path: str, gib: float, tensors: int) -> None:
    import torch
    from torch.multiprocessing.reductions import reduce_tensor
    torch.cuda.init()
    numel = int(gib * (1 << 30) / 2 / tensors)
    numel -= numel % 1024
    t0 = time.monotonic()
    held = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(tensors):
        t = torch.empty(numel, dtype=torch.bfloat16, device="cuda")
        t.view(torch.int16).random_(-(1 << 15), (1 << 15) - 1, generator=g)
        held.append(t)
    torch.cuda.synchronize()
    filled = time.monotonic() - t0
    sample = list(range(0, tensors, max(1, tensors // SAMPLE)))[:SAMPLE]
    prints = {i: _fingerprint(held[i]) for i in sample}
    t0 = time.monotonic()
    handles = [reduce_tensor(t)[1] for t in held]
    exported = time.monotonic() - t0
    free, total = torch.cuda.mem_get_info()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(4)
    print(json.dumps({"holder": {"pid": os.getpid(), "fill_s": round(filled, 3), "export_s": round(exported, 3),
                                 "bytes": numel * 2 * tensors, "tensors": tensors,
                                 "gpu_free_gib": round(free / (1 << 30), 2),
                                 "gpu_total_gib": round(total / (1 << 30), 2)}}), flush=True)
    while True:
        conn, _ = srv.accept()
        with conn:
            _send(conn, {"handles": handles, "prints": prints})
            conn.recv(1)  # the attacher says when it is done with its copy of the message


def attacher(path: str, hold_after: bool) -> None:
    t_start = time.monotonic()
    import torch
    from torch.multiprocessing.reductions import rebuild_cuda_tensor
    imported = time.monotonic() - t_start
    t0 = time.monotonic()
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    ctx = time.monotonic() - t0
    free0, _ = torch.cuda.mem_get_info()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    t0 = time.monotonic()
    msg = _recv(sock)
    received = time.monotonic() - t0
    t0 = time.monotonic()
    mapped = [rebuild_cuda_tensor(*args) for args in msg["handles"]]
    torch.cuda.synchronize()
    rebuilt = time.monotonic() - t0
    t0 = time.monotonic()
    bad = [i for i, want in msg["prints"].items() if _fingerprint(mapped[i]) != want]
    checked = time.monotonic() - t0
    free1, _ = torch.cuda.mem_get_info()
    sock.sendall(b"k")
    sock.close()
    out = {"import_torch_s": round(imported, 3), "cuda_context_s": round(ctx, 3), "recv_handles_s": round(received, 3),
           "rebuild_s": round(rebuilt, 3), "check_s": round(checked, 3), "mismatched": bad,
           "gpu_free_drop_gib": round((free0 - free1) / (1 << 30), 3),
           "mapped_gib": round(sum(t.numel() * t.element_size() for t in mapped) / (1 << 30), 2),
           "attach_s": round(time.monotonic() - t_start, 3)}
    print(json.dumps({"attach": out}), flush=True)
    if not hold_after:
        return
    # The holder is killed now; read the mapped tensors again.
    sys.stdin.readline()
    try:
        bad = [i for i, want in msg["prints"].items() if _fingerprint(mapped[i]) != want]
        torch.cuda.synchronize()
        print(json.dumps({"after_holder_killed": {"readable": True, "mismatched": bad}}), flush=True)
    except Exception as e:  # noqa: BLE001 - the outcome is what is measured
        print(json.dumps({"after_holder_killed": {"readable": False, "error": f"{type(e).__name__}: {e}"[:300]}}),
              flush=True)


def h2d(gib: float) -> dict:
    import torch
    n = int(gib * (1 << 30))
    out = {}
    for kind in ("pageable", "pinned"):
        host = torch.empty(n, dtype=torch.uint8, pin_memory=(kind == "pinned"))
        host.fill_(1)
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        dev[: 1 << 20].copy_(host[: 1 << 20])  # the first copy's set-up kept out of the timing
        torch.cuda.synchronize()
        t0 = time.monotonic()
        dev.copy_(host)
        torch.cuda.synchronize()
        dt = time.monotonic() - t0
        out[f"{kind}_gb_s"] = round(n / dt / 1e9, 2)
        del host, dev
        torch.cuda.empty_cache()
    return out


def _lines(proc: subprocess.Popen, want: str, timeout: float) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"{want}: the process ended (rc {proc.wait()})")
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if want in data:
            return data[want]
    raise SystemExit(f"{want}: no answer within {timeout} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=75.0)
    ap.add_argument("--tensors", type=int, default=1500)
    ap.add_argument("--attaches", type=int, default=3)
    ap.add_argument("--h2d-gib", type=float, default=8.0)
    ap.add_argument("--json")
    ap.add_argument("--role", choices=["holder", "attacher", "attacher-hold"], help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role == "holder":
        return holder(a.socket, a.gib, a.tensors)
    if a.role:
        return attacher(a.socket, a.role == "attacher-hold")
    if not (0 < a.gib <= 130 and 1 <= a.tensors <= 100_000 and 1 <= a.attaches <= 20 and 0 <= a.h2d_gib <= 32):
        raise SystemExit("--gib in (0, 130], --tensors in [1, 100000], --attaches in [1, 20], --h2d-gib in [0, 32]")
    try:
        import torch
    except ImportError:
        raise SystemExit("no PyTorch: this bench measures CUDA IPC and runs only where PyTorch and a GPU are") from None
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: this bench measures CUDA IPC and runs only where one is")
    d = tempfile.mkdtemp(prefix="ipc-attach-")
    os.chmod(d, 0o700)
    path = os.path.join(d, "rank0.sock")
    me = [sys.executable, os.path.abspath(__file__), "--socket", path]
    hold = subprocess.Popen([*me, "--role", "holder", "--gib", str(a.gib), "--tensors", str(a.tensors)],
                            stdout=subprocess.PIPE, text=True)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "holder": _lines(hold, "holder", 600), "attaches": []}
    print(json.dumps(result["holder"]), flush=True)
    for _ in range(a.attaches):
        p = subprocess.Popen([*me, "--role", "attacher"], stdout=subprocess.PIPE, text=True)
        result["attaches"].append(_lines(p, "attach", 300))
        p.wait(60)
        print(json.dumps(result["attaches"][-1]), flush=True)
    p = subprocess.Popen([*me, "--role", "attacher-hold"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    result["attach_before_kill"] = _lines(p, "attach", 300)
    hold.send_signal(signal.SIGKILL)
    hold.wait(60)
    p.stdin.write("go\n")
    p.stdin.flush()
    result["after_holder_killed"] = _lines(p, "after_holder_killed", 120)
    p.wait(60)
    print(json.dumps(result["after_holder_killed"]), flush=True)
    result["gpu_free_gib_after_all_exit"] = round(torch.cuda.mem_get_info()[0] / (1 << 30), 2)
    if a.h2d_gib:
        result["h2d"] = h2d(a.h2d_gib)
    print(json.dumps(result, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
