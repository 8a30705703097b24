"""What the exporter publishes about the weight-cache daemon an engine attaches to: whether it serves (its own
health check, probed at scrape time, bounded), and from the record the deploy writes after each start
(deploy/weights.py ``record``) how long its last full load took, the GPU memory a rank holds and how the engine's
last start got its weights. A missing or bad record drops only its figures (``specdeploy_exporter_input_valid``)."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily

from specdeploy.engines.weightcache import health
from specdeploy.speculation.metrics import help_of

MAX_RECORD = 64 << 10
GIB = 1 << 30


def read_record(path: Path) -> tuple[dict | None, str]:
    """(the record, '') or (None, what is wrong): a regular file of at most 64 KiB holding a JSON object."""
    import os
    import stat
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return None, "is not a regular file"
    if st.st_size > MAX_RECORD:
        return None, f"is larger than {MAX_RECORD >> 10} KiB"
    try:
        data = json.loads(Path(path).read_bytes()[:MAX_RECORD].decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None, "is not a JSON object"
    if not isinstance(data, dict):
        return None, "is not a JSON object"
    return data, ""


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0 or v > 1e12:
        return None
    return float(v)


class WeightCacheCollector:
    def __init__(self, spec: str, record: Path | None, timeout: float = 1.0, cache_s: float = 1.0,
                 probe=health):
        self.spec, self.record, self.timeout, self.cache_s, self.probe = spec, record, timeout, cache_s, probe
        self.lock = threading.Lock()
        self.last = (0.0, 0)
        self.problem = ""

    def _up(self) -> int:
        t, up = self.last
        if time.monotonic() - t < self.cache_s:
            return up
        try:
            up = int(bool(self.probe(self.spec, self.timeout)[0]))
        except Exception:  # noqa: BLE001 - an unreadable daemon is a down daemon
            up = 0
        self.last = (time.monotonic(), up)
        return up

    def collect(self):
        """The daemon's figures; ``problem`` says afterwards whether the record was readable (the exporter's
        ``specdeploy_exporter_input_valid{file="weight_cache"}``)."""
        with self.lock:
            up = self._up()
            rec, self.problem = read_record(self.record) if self.record else (None, "")
        yield GaugeMetricFamily("specdeploy_weight_cache_expected", help_of("specdeploy_weight_cache_expected"),
                                value=1.0)
        yield GaugeMetricFamily("specdeploy_weight_cache_up", help_of("specdeploy_weight_cache_up"), value=float(up))
        if not rec:
            return
        d, e = rec.get("daemon") or {}, rec.get("engine") or {}
        d = d if isinstance(d, dict) else {}
        e = e if isinstance(e, dict) else {}
        mem = _num(d.get("memory_gib_per_rank"))
        if mem is not None:
            yield GaugeMetricFamily("specdeploy_weight_cache_memory_bytes",
                                    help_of("specdeploy_weight_cache_memory_bytes"), value=mem * GIB)
        load = _num(d.get("load_s"))
        if load is not None:
            yield GaugeMetricFamily("specdeploy_weight_cache_load_seconds",
                                    help_of("specdeploy_weight_cache_load_seconds"), value=load)
        start = _num(e.get("ready_s"))
        if start is not None:
            how = "disk" if e.get("disk_fallback") is True else "attached" if e.get("attached") is True else "unknown"
            g = GaugeMetricFamily("specdeploy_engine_start_seconds", help_of("specdeploy_engine_start_seconds"),
                                  labels=["how"])
            g.add_metric([how], start)
            yield g
