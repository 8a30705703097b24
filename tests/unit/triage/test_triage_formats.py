"""The line-format layer, tested by generation: every corpus log is rewrapped line by line in every prefix form that
containers, log shippers and engines write (and nestings of them), and triage must give the same outcome, root
cause and signature as on the log as posted. A new format is added here, as one more form, and to
specdeploy/triage/normalise.py, never as a one-off pattern for one log."""
from __future__ import annotations

import re

import pytest
import yaml

from specdeploy.triage import read_log, triage_lines
from helpers import TESTS

CORPUS = TESTS / "data" / "triage"
INDEX = yaml.safe_load((CORPUS / "index.yaml").read_text())["logs"]
KSERVE = "2024-07-01 07:28:04.488 1 kserve INFO [__main__.py:<module>():254] "
OWN_PROC = re.compile(r"^.{0,200}?\([A-Za-z_][\w .:=,\-/]{0,120}?pid=\d+[^()]*\)\s?")


def _outside(prefix):
    return lambda line: prefix + line


def _process(prefix):
    """A process prefix, on lines that have none of their own (Ray and the engines prefix a child's output)."""
    return lambda line: line if OWN_PROC.match(line) else prefix + line


def _inside(tag):
    """A tag written after the process prefix when there is one (vllm-omni's stage tag, a bare source prefix)."""
    def wrap(line):
        m = OWN_PROC.match(line)
        return line[:m.end()] + tag + line[m.end():] if m else tag + line
    return wrap


def _colour(start, end):
    return lambda line: f"{start}{line}{end}" if line else line


def _nest(*forms):
    def wrap(line):
        for f in reversed(forms):
            line = f(line)
        return line
    return wrap


FORMS = {
    "docker-compose": _outside("vllm-1  | "),
    "kubectl-prefix": _outside("[pod/vllm-7d9f/engine] "),
    "gke-logging": _outside("DEFAULT 2025-11-19T20:16:36.096Z [resource.labels.containerName: vllm] "),
    "docker-timestamps": _outside("2025-03-10T15:07:20.123456789Z "),
    "ci-table": _outside("  | "),
    "journald": _outside("Feb 21 20:16:57 gpu-a vllm[4100]: "),
    "journald-iso": _outside("2026-02-21T19:48:13+0000 gpu-a vllm[4100]: "),
    "ray-actor": _process("(RayWorkerWrapper pid=22477, ip=10.0.0.2) "),
    "vllm-v1-worker": _process("(Worker_TP0 pid=4100) "),
    "vllm-v0-worker": _process("(VllmWorkerProcess pid=235) "),
    "bare-source": _inside("[core.py:720] "),
    "stage-tag": _inside("[Stage-1] "),
    "kserve": _outside(KSERVE),
    "ansi-esc": _colour("\x1b[36m", "\x1b[0m"),
    "ansi-without-esc": _colour("[36m", "[0m"),
    "ansi-literal-x1b": _colour("\\x1b[36m", "\\x1b[0m"),
    "ansi-literal-u001b": _colour("\\u001B[36m", "\\u001B[39m"),
    "ansi-caret": _colour("^[[0;36m", "^[[0;0m"),
    "nested-compose-journald-ansi-ray": _nest(_outside("vllm-1  | "), _outside("Feb 21 20:16:57 gpu-a vllm[4100]: "),
                                              _colour("\x1b[36m", "\x1b[0m"),
                                              _process("(RayWorkerWrapper pid=22477, ip=10.0.0.2) ")),
    "nested-kubectl-timestamps-stage": _nest(_outside("[pod/vllm-7d9f/engine] "),
                                             _outside("2025-03-10T15:07:20.123456789Z "), _inside("[Stage-1] ")),
    "nested-ci-compose-literal-ansi-worker": _nest(_outside("  | "), _outside("vllm-1  | "),
                                                   _colour("\\x1b[36m", "\\x1b[0m"),
                                                   _process("(Worker_TP0 pid=4100) ")),
    "nested-gke-kserve-bare-source": _nest(_outside("DEFAULT 2025-11-19T20:16:36.096Z [resource.labels.containerName: "
                                                    "vllm] "),
                                           _outside(KSERVE),
                                           _inside("[core.py:720] ")),
}


def _answer(lines):
    r = triage_lines(lines)
    return r.outcome, r.root_cause, r.signature


_AS_POSTED: dict[str, tuple] = {}


def _posted(name):
    if name not in _AS_POSTED:
        _AS_POSTED[name] = _answer(read_log(CORPUS / name))
    return _AS_POSTED[name]


@pytest.mark.parametrize("name", [e["file"] for e in INDEX])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_corpus_log_in_every_prefix_form(form, name):
    lines = read_log(CORPUS / name)
    wrapped = [FORMS[form](line) for line in lines]
    assert _answer(wrapped) == _posted(name), form


def test_the_forms_change_every_line():
    """The generator really rewraps (a form that leaves lines alone would pass vacuously)."""
    lines = read_log(CORPUS / "vllm-8177-watchdog-illegal-access.log")
    for form, wrap in FORMS.items():
        changed = sum(wrap(line) != line for line in lines if line)
        assert changed >= 0.5 * sum(1 for line in lines if line), form
