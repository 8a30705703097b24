"""Errors and findings shared by every check: each names its subject and the fix."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

Severity = Literal["error", "warning", "info"]


@dataclass
class Finding:
    severity: Severity
    subject: str
    message: str
    fix: str = ""
    host: str | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["host"] is None:
            d.pop("host")
        return d

    def line(self) -> str:
        """The finding as one line of text for a terminal: what came from outside (a host or file name, a value,
        an exception's text) shown with its control characters escaped (values.terminal)."""
        from specdeploy.values.terminal import safe
        where = f"{safe(self.host)}: " if self.host else ""
        fix = f" Fix: {safe(self.fix, newlines=True)}" if self.fix else ""
        return f"{self.severity.upper()} {where}{safe(self.subject)}: {safe(self.message, newlines=True)}{fix}"


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)

    def add(self, severity: Severity, subject: str, message: str, fix: str = "", host: str | None = None):
        self.findings.append(Finding(severity, subject, message, fix, host))

    def extend(self, findings):
        self.findings.extend(findings)

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def to_dict(self) -> dict:
        return {"ok": self.ok, "findings": [f.to_dict() for f in self.findings]}


class SpecdeployError(Exception):
    """A user-facing error: printed as one line per problem, never as a traceback."""

    def __init__(self, problems: list[Finding] | str):
        if isinstance(problems, str):
            problems = [Finding("error", "specdeploy", problems)]
        self.problems = problems
        super().__init__("\n".join(p.line() for p in problems))
