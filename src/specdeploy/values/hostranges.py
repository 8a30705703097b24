"""Many host names in one short line: runs of names that differ only in a numeric suffix of the same width are
written as Ansible writes a host range in an inventory (``gpu-[0000:0511]``), in the order the names came, and a
line never grows past ``limit`` parts (``... and 12 more``). What a fleet's operator reads where one row per host
would not fit on a screen (the live view, preflight, plan, status)."""
from __future__ import annotations

import re

_SUFFIX = re.compile(r"(.*?)(\d+)\Z")


def runs(names: list[str]) -> list[tuple[str, str, str] | str]:
    """The names as parts: (prefix, first, last) for a run of two or more consecutive numbers of one width under
    one prefix, or the name itself."""
    parts: list[list] = []
    for name in names:
        m = _SUFFIX.match(name)
        if m:
            prefix, num = m.group(1), m.group(2)
            last = parts[-1] if parts else None
            if (last is not None and isinstance(last, list) and last[0] == prefix and len(last[2]) == len(num)
                    and int(last[2]) + 1 == int(num)):
                last[2] = num
                last[3] += 1
                continue
            parts.append([prefix, num, num, 1])
        else:
            parts.append(name)
    out: list[tuple[str, str, str] | str] = []
    for p in parts:
        if isinstance(p, str):
            out.append(p)
        elif p[3] == 1:
            out.append(p[0] + p[1])
        else:
            out.append((p[0], p[1], p[2]))
    return out


def compact(names: list[str], limit: int = 6) -> str:
    """``names`` in one line: ``gpu-[0000:1023]``, ``gpu-[0000:0009], gpu-0012, mon-1``; at most ``limit`` parts,
    then how many names the rest holds."""
    parts = runs(list(names))
    text = [f"{p[0]}[{p[1]}:{p[2]}]" if isinstance(p, tuple) else p for p in parts]
    if len(text) <= limit:
        return ", ".join(text)
    rest = 0
    for p in parts[limit:]:
        rest += (int(p[2]) - int(p[1]) + 1) if isinstance(p, tuple) else 1
    return ", ".join(text[:limit]) + f" and {rest} more"
