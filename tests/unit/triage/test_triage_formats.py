"""The line-format layer, tested by generation: every corpus log is rewrapped line by line in every prefix form that
containers, log shippers and engines write (and nestings of them), and triage must give the same outcome, root
cause and signature as on the log as posted. A new format is added here, as one more form, and to
specdeploy/triage/normalise.py (or unwrap.py), never as a one-off pattern for one log.

The shapes an operator pastes (SHAPES: dates of other precisions, journald and syslog with a unit and a PID, HTML
from a web page, table cells, JSON records and quoted messages) run on every corpus log alone and nested two deep
with a partner that rotates over every form; bench/bench_triage_large.py --rewrap runs the whole cross product."""
from __future__ import annotations

import html
import json
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


def _json(record):
    return lambda line: json.dumps({**record, "log" if "log" in record else "message": line + ("\n" if "log" in record
                                                                                                else "")})


def _html_page(line):
    return f'<span class="line">{html.escape(line)}</span><br>'


def _json_block(lines):
    """Four lines at a time in one JSON error body (an HTTP error's detail, a front-end's message field)."""
    return [json.dumps({"detail": "\n".join(lines[i:i + 4])}) for i in range(0, len(lines), 4)]


SHAPES = {
    "py-logging": _outside("2025-12-04 21:57:21.581795+08:00 - specdeploy.worker - INFO - "),
    "bracket-datetime-level": _outside("[2026-01-14 18:54:21,503] INFO: "),
    "bracket-datetime": _outside("[2025-03-10 15:07:20.123] "),
    "loguru": _outside("2025-11-19 11:14:59.028 | INFO     | __main__:serve:95 | "),
    "level-fulldate-ray": _outside("INFO 2024-11-18 01:46:34,210 default_VLLMDeployment ujj4diu5 replica.py:893 - "),
    "time-of-day": _outside("15:07:20.123456 "),
    "journald-precise": _outside("Feb 21 20:16:57.123456 gpu-a specdeploy-vllm[4100]: "),
    "journald-iso-us": _outside("2026-02-21T19:48:13.123456+00:00 gpu-a python3[4100]: "),
    "syslog-5424": _outside("<14>1 2026-02-21T19:48:13.123Z gpu-a vllm 4100 - - "),
    "syslog-3164": _outside("<14>Feb 21 20:16:57 gpu-a vllm[4100]: "),
    "html-escaped": html.escape,
    "html-page": _html_page,
    "table-row": lambda line: f"| vllm_model | 1       | {line} |",
    "box-cell": lambda line: f"│ {line} │",
    "docker-json": _json({"log": "", "stream": "stderr", "time": "2025-03-10T15:07:20.123456789Z"}),
    "shipper-json": _json({"timestamp": "2025-03-10T15:07:20.123Z", "host": "gpu-a", "message": ""}),
    "quoted": json.dumps,
    "glog-quoted": lambda line: "I0911 08:21:51.554457 1 pb_stub.cc:389] " + json.dumps(line),
}
ALL_FORMS = {**FORMS, **SHAPES}


def nested_two_deep(shape: str, log_index: int) -> list[tuple[str, object]]:
    """The shape alone, around a partner form and inside it; the partner rotates over every form with the log, so
    every pair is exercised across the corpus (the whole product: bench/bench_triage_large.py --rewrap)."""
    names = sorted(ALL_FORMS)
    partner = names[(log_index * 7 + sorted(SHAPES).index(shape) * 3) % len(names)]
    if partner == shape:
        partner = names[(names.index(partner) + 1) % len(names)]
    outer, inner = SHAPES[shape], ALL_FORMS[partner]
    return [(shape, outer), (f"{shape}({partner})", _nest(outer, inner)), (f"{partner}({shape})", _nest(inner, outer))]


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


@pytest.mark.parametrize("index,name", list(enumerate(e["file"] for e in INDEX)))
def test_every_corpus_log_in_every_pasted_shape_nested_two_deep(index, name):
    lines = read_log(CORPUS / name)
    wrong = []
    for shape in sorted(SHAPES):
        for label, wrap in nested_two_deep(shape, index):
            got = _answer([wrap(line) for line in lines])
            if got != _posted(name):
                wrong.append((label, got))
    block = _answer(_json_block(lines))
    if block != _posted(name):
        wrong.append(("json-block", block))
    assert not wrong, (_posted(name), wrong[:4])


def test_the_pasted_shapes_change_every_line():
    lines = [ln for ln in read_log(CORPUS / "vllm-8177-watchdog-illegal-access.log") if ln]
    for shape, wrap in SHAPES.items():
        if shape == "html-escaped":             # only what HTML escapes changes
            special = [line for line in lines if re.search(r"[&<>\"']", line)]
            assert special and all(wrap(line) != line for line in special)
            continue
        assert sum(wrap(line) != line for line in lines) >= 0.9 * len(lines), shape
    assert len(_json_block(lines)) == -(-len(lines) // 4)
