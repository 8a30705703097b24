"""Templates in inventory variables and ``-e`` values, read as ansible-playbook reads them but within bounds.

An inventory's values may be Jinja, which specdeploy renders with Ansible's own Templar (the same answer as the
play). A template can also loop, build a string of gigabytes or run a lookup plugin (a command, a file, a network
request) while a plan or a preflight merely reads the inventory. Before a value is rendered, :func:`problem`
refuses what has no bound: loops and macros (``{% for %}``, ``{% macro %}``, ``{% call %}``, includes and
imports), powers, ``lookup``/``query``/``q``, the combinatorial filters (``permutations``, ``combinations``,
``product``), ``range`` beyond :data:`MAX_CONST`, a string or list repeated with ``*``, and any number beyond
:data:`MAX_CONST`. What passes is rendered under :func:`time_limit` (:data:`BUDGET_S` for one inventory). A value
refused here is refused with its variable, its host and the fix, never rendered half.
"""
from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

MAX_CONST = 10_000_000
BUDGET_S = 10.0
UNBOUNDED_FILTERS = ("permutations", "combinations", "product")
PLUGIN_CALLS = ("lookup", "query", "q")
MARKS = ("{{", "{%", "{#")


def problem(text: str) -> str | None:
    """Why the template ``text`` is not rendered (see the module), or None (also for text that is not a
    template, and for a template Jinja cannot parse: Ansible reports that in its own words)."""
    if not isinstance(text, str) or not any(m in text for m in MARKS):
        return None
    from jinja2 import Environment, TemplateSyntaxError, nodes
    try:
        tree = Environment().parse(text)
    except (TemplateSyntaxError, RecursionError, MemoryError):
        return None
    blocks = {nodes.For: "a {% for %} loop", nodes.Macro: "a {% macro %}", nodes.CallBlock: "a {% call %} block",
              nodes.FilterBlock: "a {% filter %} block", nodes.Include: "an {% include %}",
              nodes.Import: "an {% import %}", nodes.FromImport: "an {% import %}", nodes.Extends: "an {% extends %}"}
    for kind, what in blocks.items():
        if next(tree.find_all(kind), None) is not None:
            return f"uses {what}"
    if next(tree.find_all(nodes.Pow), None) is not None:
        return "raises a number to a power (**)"
    for c in tree.find_all(nodes.Const):
        if isinstance(c.value, (int, float)) and not isinstance(c.value, bool) and abs(c.value) > MAX_CONST:
            return f"uses the number {c.value}, beyond the {MAX_CONST:,} specdeploy renders"
    for m in tree.find_all(nodes.Mul):
        for side in (m.left, m.right):
            if isinstance(side, (nodes.List, nodes.Tuple)) or isinstance(side, nodes.Const) and \
                    isinstance(side.value, str):
                return "repeats a string or a list with *"
    for f in tree.find_all(nodes.Filter):
        if f.name in UNBOUNDED_FILTERS:
            return f"uses the {f.name} filter, whose result grows without bound"
    for call in tree.find_all(nodes.Call):
        name = call.node.name if isinstance(call.node, nodes.Name) else None
        if name in PLUGIN_CALLS:
            return f"calls {name}(), which runs a lookup plugin (a file, a command, a request) on the controller"
    return None


def problems_in(value, where: str = "") -> list[tuple[str, str]]:
    """(where, why) for every string in ``value`` (keys and items included) that :func:`problem` refuses."""
    out: list[tuple[str, str]] = []
    todo = [(value, where)]
    while todo:
        v, w = todo.pop()
        if isinstance(v, str):
            why = problem(v)
            if why:
                out.append((w, why))
        elif isinstance(v, dict):
            todo.extend((x, f"{w}[{k!r}]") for k, x in v.items())
            todo.extend((k, f"{w} key {k!r}") for k in v if isinstance(k, str))
        elif isinstance(v, (list, tuple)):
            todo.extend((x, f"{w}[{i}]") for i, x in enumerate(v))
    return out


class TimeUp(Exception):
    """The budget of :func:`time_limit` ran out."""


class _Clock:
    expired = False


CLOCK = _Clock()


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`TimeUp` in the block after ``seconds``, and again every 0.2 s until the block ends (Ansible
    catches exceptions inside a render and may render again); :data:`CLOCK` ``.expired`` says it ran out, for
    code that sees the exception wrapped. The main thread only (elsewhere the block runs unbounded). A timer
    already set around the block keeps its own deadline and handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old_handler = signal.getsignal(signal.SIGALRM)
    outer, interval = signal.getitimer(signal.ITIMER_REAL)
    start = time.monotonic()
    outer_first = bool(outer) and outer <= seconds
    CLOCK.expired = False

    def fired(signum, frame):
        if outer_first and callable(old_handler):
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old_handler)
            old_handler(signum, frame)
        CLOCK.expired = True
        raise TimeUp()
    signal.signal(signal.SIGALRM, fired)
    signal.setitimer(signal.ITIMER_REAL, min(seconds, outer) if outer else seconds, 0.2)
    try:
        yield
        if CLOCK.expired:
            raise TimeUp()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if outer:
            left = outer - (time.monotonic() - start)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001), interval)
