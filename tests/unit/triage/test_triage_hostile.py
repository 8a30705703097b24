"""No input makes triage raise, and no input takes unbounded time: generated hostile input (control characters, the
characters every prefix and wrapper is made of, quoted JSON nested deeper than the normaliser unfolds, HTML of HTML,
lines of any length) and hand-made pathological lines for the patterns that could backtrack."""
from __future__ import annotations

import html
import json
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdeploy.triage import MAX_LINE, normalise, triage_files, triage_lines

OUTCOMES = {"failed", "clean-shutdown", "killed", "no-exception-found"}
# the characters the formats are made of, and words the evidence patterns look for
PIECES = ['"', "\\", "\\n", "{", "}", "[", "]", "(", ")", "|", "│", ":", "&", ";", "<", ">", "&quot;", "&amp;", "<br>",
          "\x1b[36m", "^[[0m", "\\x1b[0m", "\r", "\x00", "\t", " ", "\n", "pid=", "(Worker_TP0 pid=1) ", "ERROR ",
          "INFO 01-01 00:00:00 [x.py:1] ", "Traceback (most recent call last):", '  File "/x.py", line 1, in f',
          "ValueError: ", "Error: ", "panicked at ", "terminate called after throwing an instance of 'c10::Error'",
          "what(): ", "Assertion `", "' failed.", "[FUNC:a][FILE:b.cc][LINE:1]", "Out of memory: Killed process 1 (x)",
          "died unexpectedly", "Exception ignored in: ", '{"log": "', '"message": "', "\\u001b", "\\\\", "2025-01-01 ",
          "12:00:00.123 ", "Feb 21 20:16:57 host unit[1]: ", "<14>1 ", "| vllm | 1 | ", "UNAVAILABLE: Internal: "]
line_text = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=8)), max_size=24).map("".join)


def _wrapped(base):
    """A line inside any number of the containers, in any order (JSON records, quoted messages, HTML)."""
    return st.recursive(base, lambda inner: st.one_of(
        inner.map(json.dumps), inner.map(lambda x: json.dumps({"log": x + "\n", "stream": "stderr"})),
        inner.map(lambda x: 'I0101 00:00:00.000000 1 x.cc:1] ' + json.dumps(x)), inner.map(html.escape),
        inner.map(lambda x: f"| m | 1 | {x} |"), inner.map(lambda x: "Dispatch: 500: " + json.dumps({"detail": x}))),
        max_leaves=6)


def _check(lines):
    res = triage_lines(lines)
    assert res.outcome in OUTCOMES
    json.dumps(res.to_dict())
    assert res.root_cause is None or len(res.root_cause) <= 2 * MAX_LINE
    return res


@settings(max_examples=300, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(line_text, _wrapped(line_text)), max_size=30))
def test_generated_hostile_lines_never_raise(lines):
    _check(lines)


@settings(max_examples=100, deadline=None, database=None, derandomize=True)
@given(st.binary(max_size=4000))
def test_bytes_never_raise(data):
    _check(data.split(b"\n"))


def test_quoted_json_nested_deeper_than_it_is_unfolded():
    line = "(Worker_TP0 pid=1) ERROR 01-01 00:00:00 [x.py:1] ValueError: deep"
    for _ in range(14):                        # far deeper than any shipper nests, and longer than MAX_LINE
        line = json.dumps({"log": line + "\n", "stream": "stderr"})
    assert len(line) > MAX_LINE
    t0 = time.perf_counter()
    _check([line] * 50)
    shallow = line = "(Worker_TP0 pid=1) ERROR 01-01 00:00:00 [x.py:1] ValueError: deep"
    for _ in range(3):
        shallow = json.dumps({"log": shallow + "\n"})
    assert triage_lines([shallow]).root_cause == "ValueError: deep"      # what a shipper really does is unfolded
    assert time.perf_counter() - t0 < 10


def test_one_line_never_unfolds_into_more_than_a_bounded_number_of_records():
    body = "\n".join(f"(Worker_TP{i % 8} pid=1) INFO 01-01 00:00:00 [x.py:1] line {i}" for i in range(5000))
    recs = normalise([json.dumps({"log": body})])
    assert 0 < len(recs) <= 400


def test_control_characters_and_lines_of_any_length():
    controls = "".join(chr(c) for c in range(32)) + "\x7f\u2028\u2029\ufeff\ufffd"
    lines = [controls * 50, "x" * (5 << 20), controls + "RuntimeError: after controls", "\x00" * 1000,
             "(" * 100_000, "Traceback (most recent call last):" * 2000]
    _check(lines)
    assert _check(["RuntimeError: before controls" + controls]).root_cause.startswith("RuntimeError: before controls")


def test_pathological_lines_cost_bounded_time():
    """Lines built to make a backtracking pattern explode (repeated prefixes of what the patterns look for)."""
    n = MAX_LINE
    cases = ["a." * (n // 2), "[" * n, "(" * n, '"' * n, "\\" * n, "{" * n, "&amp;" * (n // 5), "<span>" * (n // 6),
             "| " * (n // 2), "│" * n, "x" * n + "Error: y", "Assertion `" * (n // 11), "ValueError: " * (n // 12),
             "x[FUNC:a][FILE:b][LINE:1]" * (n // 26), "thread 'a' panicked at " * (n // 23), "\\x1b[" * (n // 5),
             '"message": "' * (n // 12), "<br>" * (n // 4), "INFO " * (n // 5), 'File "' * (n // 6),
             "2025-01-01 " * (n // 11), "(Worker pid=1) " * (n // 15)]
    for line in cases:
        t0 = time.perf_counter()
        _check([line] * 3)
        assert time.perf_counter() - t0 < 3.0, line[:30]


def test_a_binary_file_and_a_file_of_one_huge_line(tmp_path):
    import random
    rng = random.Random(11)
    binary = tmp_path / "binary.log"
    binary.write_bytes(bytes(rng.getrandbits(8) for _ in range(300_000)))
    assert triage_files([binary]).outcome in OUTCOMES
    huge = tmp_path / "huge-line.log"
    huge.write_bytes(b'{"log": "' + b"\\n" * (3 << 20) + b'"}\n' + b"RuntimeError: the end\n")
    assert triage_files([huge]).root_cause == "RuntimeError: the end"
