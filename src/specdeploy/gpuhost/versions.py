"""Versions: of a driver, of the CUDA a driver branch supports, of the CUDA an engine image needs."""
from __future__ import annotations

import re

Version = tuple[int, ...]


def version(text: str | None) -> Version | None:
    m = re.match(r"\s*(\d+(?:\.\d+)*)", text or "")
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def _mm(v: Version | None) -> Version | None:
    return None if v is None else (v + (0,))[:2]


def _fmt(v: Version | None) -> str:
    return ".".join(map(str, v)) if v else "unknown"


# The CUDA version (major.minor) each Linux driver branch supports natively: the "CUDA Version" nvidia-smi prints
# for that branch (CUDA toolkit release notes, table "CUDA Toolkit and corresponding driver versions").
BRANCH_CUDA: dict[int, Version] = {
    525: (12, 0), 530: (12, 1), 535: (12, 2), 545: (12, 3), 550: (12, 4), 555: (12, 5), 560: (12, 6),
    565: (12, 7), 570: (12, 8), 575: (12, 9), 580: (13, 0),
}

# The first CUDA release that compiles for each SM generation (Blackwell SM100/SM120: CUDA 12.8).
SM_MIN_CUDA: dict[int, Version] = {80: (11, 0), 89: (11, 8), 90: (11, 8), 100: (12, 8), 103: (12, 9),
                                   120: (12, 8)}

def image_cuda(engine: str, engine_version: str) -> tuple[Version | None, Version | None]:
    """(lowest, highest) major.minor CUDA the engine version's official image may need; (None, None) if unknown."""
    # recorded per engine in its adapter (``image_cuda``), read from the release's Dockerfile (ARG CUDA_VERSION=).
    # Versions between two recorded points are resolved only when both points agree on major.minor; otherwise
    # the answer is a range.
    from specdeploy.engines import get
    points = sorted((version(k), _mm(version(v))) for k, v in get(engine).image_cuda.items())
    want = version(engine_version)
    if want is None or not points:
        return None, None
    for v, cuda in points:
        if v == want:
            return cuda, cuda
    below = [c for v, c in points if v < want]
    above = [c for v, c in points if v > want]
    if below and above:
        return below[-1], above[0]
    return None, None


def driver_cuda(driver: str | None, reported: str | None = None) -> Version | None:
    """The CUDA version a driver supports: what nvidia-smi reports, else the branch table."""
    if reported and version(reported):
        return _mm(version(reported))
    v = version(driver)
    return BRANCH_CUDA.get(v[0]) if v else None
