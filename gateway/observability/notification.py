"""One alert message, rendered per sink flavour: JSON for generic webhooks, markdown for WeCom and Slack.

Rules and failure alerts build a `Notification` from plain values; sinks only render it. Fields are an
ordered list of (name, value) so every sink shows them in the same order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["firing", "resolved", "failure", "failure_summary", "test"]
Severity = Literal["critical", "warning", "info"]
FieldValue = str | int | float | None

_MARK = {
    "firing": "FIRING",
    "resolved": "RESOLVED",
    "failure": "FAILED",
    "failure_summary": "FAILED",
    "test": "TEST",
}
_WECOM_COLOR = {"critical": "warning", "warning": "warning", "info": "info"}


def _fmt(value: FieldValue) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


@dataclass(frozen=True, slots=True)
class Notification:
    kind: Kind
    title: str
    severity: Severity = "warning"
    fields: tuple[tuple[str, FieldValue], ...] = ()
    rule: str | None = None
    key: str | None = None  # the subject (pool, backend, class) a rule alert is about
    lines: tuple[str, ...] = ()  # free-form detail lines (summaries)
    at: float = field(default_factory=time.time)  # wall-clock seconds, for display only

    @property
    def headline(self) -> str:
        return f"[{_MARK[self.kind]}] {self.title}"

    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.at))

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": "omnigate",
            "kind": self.kind,
            "status": "resolved" if self.kind == "resolved" else "firing",
            "severity": self.severity,
            "title": self.title,
            "rule": self.rule,
            "key": self.key,
            "fields": dict(self.fields),
            "lines": list(self.lines),
            "at": self.at,
            "text": self.text(),
        }

    def text(self) -> str:
        body = [self.headline]
        body += [f"{name}: {_fmt(value)}" for name, value in self.fields]
        body += list(self.lines)
        body.append(f"at: {self.when()}")
        return "\n".join(body)

    def wecom_markdown(self) -> str:
        """WeCom robot markdown: `#` headings, `>` quotes, <font color="info|comment|warning">."""
        color = "info" if self.kind == "resolved" else _WECOM_COLOR[self.severity]
        body = [f'### <font color="{color}">{_MARK[self.kind]}</font> {self.title}']
        body += [f'> {name}: <font color="comment">{_fmt(value)}</font>' for name, value in self.fields]
        body += list(self.lines)
        body.append(f'<font color="comment">{self.when()}</font>')
        return "\n".join(body)

    def slack_mrkdwn(self) -> str:
        body = [f"*{self.headline}*"]
        body += [f"• *{name}*: `{_fmt(value)}`" for name, value in self.fields]
        body += list(self.lines)
        body.append(f"_{self.when()}_")
        return "\n".join(body)
