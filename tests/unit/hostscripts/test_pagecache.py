"""The page-cache warm a deploy runs on a host before an engine restart without a weight-cache daemon: it reads the
checkpoint only when the host's available memory holds it (checked from /proc/meminfo, never assumed), and says
how much it read and how fast."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specdeploy.hostscripts import pagecache
from specdeploy.testing.fixtures import write_model

GIB = 1 << 30


@pytest.fixture
def model(tmp_path):
    return write_model(tmp_path / "m", {"architectures": ["X"]}, shards=3, random_bytes=1 << 20,
                       hole_bytes=4 << 20)


def test_it_reads_the_checkpoint_when_it_fits(model):
    mem = {"MemTotal": 64 * GIB, "MemAvailable": 32 * GIB}
    p = pagecache.plan(str(model), None, mem)
    assert p["fits"] and p["files"] == 3 and p["margin"] == 8 * GIB
    assert p["bytes"] == sum(f.stat().st_size for f in model.glob("*.safetensors"))
    w = pagecache.warm(p["_paths"], 60)
    assert w["read_bytes"] == p["bytes"] and w["complete"]


def test_it_reads_nothing_when_it_does_not_fit(model):
    p = pagecache.plan(str(model), 0, {"MemTotal": 1 << 20, "MemAvailable": 1 << 20})
    assert not p["fits"] and p["short_by"] == p["bytes"] - (1 << 20)


def test_an_index_that_leaves_the_directory_is_refused(model, tmp_path):
    idx = model / "model.safetensors.index.json"
    data = json.loads(idx.read_text())
    data["weight_map"]["x"] = "../outside.safetensors"
    (tmp_path / "outside.safetensors").write_bytes(b"x")
    idx.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="leaves"):
        pagecache.weight_files(str(model))


def test_it_runs_as_the_host_runs_it_on_stdin(model):
    """The role feeds the script to the host's python3 on stdin (stdlib only); --check reads nothing."""
    src = open(pagecache.__file__).read()
    r = subprocess.run([sys.executable, "-", "warm", str(model), "--check"], input=src, capture_output=True,
                       text=True, timeout=60)
    out = json.loads(r.stdout)
    assert r.returncode == 0 and "read_bytes" not in out and out["files"] == 3
    r = subprocess.run([sys.executable, "-", "warm", str(model), "--margin-gib", "0"], input=src,
                       capture_output=True, text=True, timeout=60)
    out = json.loads(r.stdout)
    assert out["fits"] and out["read_bytes"] == out["bytes"]
    r = subprocess.run([sys.executable, "-", "warm", "/nonexistent"], input=src, capture_output=True, text=True)
    assert r.returncode == 2 and "not a directory" in json.loads(r.stdout)["error"]
    r = subprocess.run([sys.executable, "-", "warm", str(model), "--margin-gib", "-1"], input=src,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "out of range" in r.stdout
