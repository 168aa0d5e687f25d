"""Trace replay: production logs as JSONL rows `{"timestamp": s, "request": {...}, "headers": {...}}`.

Timestamps are seconds (absolute or relative); the first row is sent at offset 0 and the rest keep
their spacing divided by `speed`. Requests are forced to stream with usage so every metric exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from loadtest.client import PreparedRequest


class TraceError(ValueError):
    """A trace file that cannot be replayed; names the file and line."""


def bucket_of(body: dict[str, Any]) -> str:
    """The content bucket a request falls in, from its message parts (what the gateway classifies)."""
    images = audios = 0
    for msg in body.get("messages") or ():
        content = msg.get("content") if isinstance(msg, dict) else None
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            images += kind == "image_url"
            audios += kind in ("input_audio", "audio_url")
    if audios:
        return "audio"
    return "multi_image" if images > 1 else "single_image" if images == 1 else "text"


def _request(row: dict[str, Any], where: str) -> PreparedRequest:
    body = row.get("request")
    if not isinstance(body, dict):
        raise TraceError(f"{where}: 'request' must be an object")
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    headers = {str(k).lower(): str(v) for k, v in (row.get("headers") or {}).items()}
    auth = headers.get("authorization", "")
    priority = headers.get("x-priority")
    return PreparedRequest(
        body=body,
        headers=headers,
        bucket=str(row.get("bucket") or bucket_of(body)),
        tenant=auth.removeprefix("Bearer ").strip(),
        priority=int(priority) if priority and priority.lstrip("-").isdigit() else None,
        traffic_class=headers.get("x-omnigate-class", ""),
    )


def load_trace(path: str | Path, speed: float = 1.0) -> list[tuple[float, PreparedRequest]]:
    """(send offset, request) pairs sorted by time."""
    rows: list[tuple[float, PreparedRequest]] = []
    try:
        lines = Path(path).read_bytes().splitlines()
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = orjson.loads(line)
            ts = float(row["timestamp"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise TraceError(f"{where}: expected {{'timestamp': number, 'request': {{...}}}}: {e}") from None
        rows.append((ts, _request(row, where)))
    if not rows:
        raise TraceError(f"{path}: no requests")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    return [((ts - t0) / speed, req) for ts, req in rows]
