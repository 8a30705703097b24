"""Read safetensors checkpoints through the ``safetensors`` library (headers, dtypes, shapes, and that the
tensors cover the whole file) without reading any weights; write sparse copies. The format: 8-byte
little-endian header length, a JSON header, then the tensor bytes."""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path


DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
               "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U32": 4, "U16": 2, "U64": 8}
INDEX_FILE = "model.safetensors.index.json"
BIN_CONVERT = ("python3 -c \"import torch, safetensors.torch as st; "
               "st.save_file({k: v.contiguous() for k, v in torch.load('pytorch_model.bin', map_location='cpu', "
               "weights_only=True).items()}, 'model.safetensors', metadata={'format': 'pt'})\"")


class SafetensorsError(ValueError):
    pass


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    begin: int  # absolute file offsets
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def _validate(path: Path):
    """Let the safetensors library parse and validate the file (header JSON, dtypes, shapes against offsets,
    offsets covering the whole data section); any failure becomes one clean error naming the file."""
    from safetensors import SafetensorError, safe_open  # here: a config-only checkpoint never loads the library

    from specdeploy.values.bounded import Refused, regular_file
    try:
        regular_file(path)  # a FIFO would block the open below
    except Refused as exc:
        raise SafetensorsError(f"{path.name}: {exc}") from None
    except OSError as exc:
        raise SafetensorsError(f"{path.name}: cannot be read ({exc.strerror or exc})") from None
    try:
        with safe_open(str(path), framework="numpy") as fh:
            fh.keys()
    except (SafetensorError, OSError, ValueError, TypeError) as exc:
        why = str(exc) or type(exc).__name__
        if "MetadataIncompleteBuffer" in why:
            why = "the tensors do not cover the file (truncated or padded; MetadataIncompleteBuffer)"
        raise SafetensorsError(f"{path.name}: not a valid safetensors file: {why}") from None


def read_header(path: Path) -> tuple[dict, int]:
    """Return (header dict, offset where tensor data starts), after the library validated the file."""
    _validate(path)
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    return header, 8 + n


def tensors(path: Path) -> dict[str, TensorInfo]:
    header, base = read_header(path)
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        b, e = meta["data_offsets"]
        out[name] = TensorInfo(name, meta["dtype"], tuple(meta["shape"]), path, base + b, base + e)
    return out


def checkpoint_tensors(directory: Path) -> dict[str, TensorInfo]:
    """All tensors of a checkpoint directory. With an index file, every shard it names must exist and hold
    exactly the tensors it maps to that shard."""
    files = sorted(directory.glob("*.safetensors"))
    out: dict[str, TensorInfo] = {}
    for f in files:
        for name, info in tensors(f).items():
            if name in out:
                raise SafetensorsError(f"{name} is in both {out[name].file.name} and {f.name}")
            out[name] = info
    idx = directory / INDEX_FILE
    if idx.is_file():
        try:
            from specdeploy.values.bounded import loads, read_regular
            weight_map = loads(read_regular(idx, 256 << 20))["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, OSError):
            raise SafetensorsError(f"{INDEX_FILE}: not JSON with a weight_map object") from None
        missing = sorted({str(s) for s in weight_map.values()} - {f.name for f in files})
        if missing:
            raise SafetensorsError(f"{INDEX_FILE} names shard(s) {missing[:3]} that are not in {directory}")
        wrong = [n for n, s in weight_map.items() if n not in out or out[n].file.name != s]
        if wrong:
            raise SafetensorsError(f"{INDEX_FILE} maps {len(wrong)} tensor(s) to a shard that does not hold "
                                   f"them, e.g. {wrong[0]}")
    return out


def bin_only(directory: Path) -> list[str]:
    """PyTorch pickle weight files of a directory that has no safetensors (not inspectable without torch)."""
    if any(directory.glob("*.safetensors")):
        return []
    return sorted(f.name for f in directory.glob("*.bin")) + sorted(f.name for f in directory.glob("*.pt"))


def read_array(info: TensorInfo, max_bytes: int = 64 << 20):
    """One small index tensor (d2t, t2d) as a flat numpy array."""
    if info.nbytes > max_bytes:
        raise SafetensorsError(f"{info.name} is {info.nbytes} bytes; refusing to read more than {max_bytes}")
    if info.dtype not in ("I64", "I32", "BOOL", "U8", "I8"):
        raise SafetensorsError(f"{info.name}: dtype {info.dtype} is not an index type")
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(info.file), framework="numpy") as fh:
            return fh.get_tensor(info.name).reshape(-1)
    except (SafetensorError, OSError, ValueError, TypeError) as exc:
        raise SafetensorsError(f"{info.file.name}: cannot read {info.name}: {exc}") from None


def read_tensor(info: TensorInfo, max_bytes: int = 64 << 20) -> list:
    """One small index tensor (d2t, t2d) as a flat Python list."""
    return read_array(info, max_bytes).tolist()


def encode_header(header: dict) -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    return struct.pack("<Q", len(raw)) + raw


def sparse_copy_range(src, dst, src_off: int, dst_off: int, length: int, chunk: int = 1 << 20):
    """Copy bytes, skipping holes and all-zero chunks so sparse files stay sparse."""
    end = src_off + length
    pos = src_off
    fd = src.fileno()
    while pos < end:
        try:
            data_at = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:  # no data until EOF
            break
        if data_at >= end:
            break
        try:
            hole_at = min(os.lseek(fd, data_at, os.SEEK_HOLE), end)
        except OSError:
            hole_at = end
        p = data_at
        while p < hole_at:
            n = min(chunk, hole_at - p)
            src.seek(p)
            buf = src.read(n)
            if buf.count(0) != len(buf):
                dst.seek(dst_off + (p - src_off))
                dst.write(buf)
            p += n
        pos = hole_at


def rewrite_names(src: Path, dst: Path, rename) -> int:
    """Write ``dst`` with tensor names mapped by ``rename``; the data is copied sparsely. Returns renames."""
    header, base = read_header(src)
    new, changed = {}, 0
    for name, meta in header.items():
        if name == "__metadata__":
            new[name] = meta
            continue
        nn = rename(name)
        changed += nn != name
        if nn in new:
            raise SafetensorsError(f"{src}: renaming gives a duplicate tensor {nn}")
        new[nn] = meta
    head = encode_header(new)
    size = os.path.getsize(src)
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        fo.write(head)
        fo.truncate(len(head) + size - base)
        sparse_copy_range(fi, fo, base, len(head), size - base)
    return changed


def write_sparse(path: Path, specs: dict[str, tuple[str, tuple[int, ...]]], data: dict[str, bytes] | None = None,
                 metadata: dict | None = None):
    """Write a safetensors file whose tensors are zero (holes) except those given in ``data``."""
    data = data or {}
    header: dict = {"__metadata__": metadata or {"format": "pt"}}
    off = 0
    for name, (dtype, shape) in specs.items():
        n = DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    head = encode_header(header)
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(len(head) + off)
        for name, raw in data.items():
            b, e = header[name]["data_offsets"]
            if len(raw) != e - b:
                raise SafetensorsError(f"{name}: {len(raw)} bytes given, {e - b} expected")
            fh.seek(len(head) + b)
            fh.write(raw)
