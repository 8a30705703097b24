"""What the exporter publishes from the measured price of speculation on its host (speculation/surface.py): the
acceptance length speculation at the deployed k needs per load band, and the one for the band that holds the
engine's running requests now. The continuous gate compares the live acceptance length with that figure where a
surface exists (the rules' ``specdeploy:spec_predicted_speedup``), and with the gate's step-time ratio where none
does.

The surface is the file ``specdeploy breakeven --measure --out <state>/surface`` wrote on the host. It is read at
scrape time (bounded; re-read only when it changes) and used only when it was measured for the engine and release
the host runs now and at its k: a surface of another engine, release or k drops its figures, and
``specdeploy_exporter_input_valid{file="surface"}`` says so, as for every other input file."""
from __future__ import annotations

import os
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily

from specdeploy.speculation import surface as S
from specdeploy.speculation.metrics import help_of


class SurfaceFigures:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.problem = ""
        self._key: tuple | None = None
        self._surface: dict | None = None
        self._why = ""

    def _read(self) -> tuple[dict | None, str]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._key, self._surface, self._why = None, None, ""
            return None, ""
        except OSError as exc:
            return None, f"cannot be read: {exc.strerror or exc}"
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._key:
            self._surface, self._why = S.read(self.path)
            self._key = key
        return self._surface, self._why

    def rows(self, engine: str, version: str, k: int) -> tuple[list[dict], str]:
        """The surface's needed-AL rows at ``k`` for the engine and release running now, and what is wrong ('' when
        the rows can be used or there is no surface)."""
        surface, why = self._read()
        if surface is None:
            return [], why
        if surface.get("engine") != engine or (version and surface.get("release") != version):
            return [], (f"measured on {surface.get('engine')} {surface.get('release')}, the host runs {engine} "
                        f"{version or '?'}: measure again (specdeploy breakeven --measure)")
        if k <= 0:
            return [], ""  # speculation is off: nothing to compare
        rows = S.band_needs(surface, k)
        if not rows:
            return [], f"measured no point at k={k}, the deployed k: measure again with --k {k}"
        return sorted(rows, key=lambda r: r.get("from_batch") or 0), ""

    def collect(self, engine: str, version: str, k: int, running: float | None) -> list:
        rows, self.problem = self.rows(engine, version, k)
        if not rows:
            return []
        band = GaugeMetricFamily("specdeploy_surface_needed_acceptance_length",
                                 help_of("specdeploy_surface_needed_acceptance_length"),
                                 labels=["from_batch", "speedup"])
        for r in rows:
            for what, target in (("breakeven", "1.0"), ("keep", "margin")):
                al = (r.get(what) or {}).get("al")
                if al is not None:
                    band.add_metric([str(r.get("from_batch") or 1), target], float(al))
        out = [band]
        if running is not None:
            row = S.band_of(rows, running)
            al = ((row or {}).get("breakeven") or {}).get("al")
            if al is not None:
                out.append(GaugeMetricFamily("specdeploy_surface_needed_acceptance_length_now",
                                             help_of("specdeploy_surface_needed_acceptance_length_now"),
                                             value=float(al)))
        return out
