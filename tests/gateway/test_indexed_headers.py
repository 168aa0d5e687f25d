"""IndexedHeaders answers every lookup as Starlette's Headers does."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from gateway.http.asgi import IndexedHeaders, IndexedRequest

pytestmark = pytest.mark.unit

RAW = [
    (b"authorization", b"Bearer one"),
    (b"x-priority", b"high"),
    (b"x-priority", b"low"),
    (b"x-empty", b""),
    (b"X-Upper", b"kept as sent"),
    (b"x-latin", "caf\xe9".encode("latin-1")),
]
NAMES = (
    "authorization",
    "Authorization",
    "x-priority",
    "X-PRIORITY",
    "x-empty",
    "x-upper",
    "x-latin",
    "none",
)


def test_lookups_match_starlettes() -> None:
    ours, theirs = IndexedHeaders({"headers": list(RAW)}), Headers(scope={"headers": list(RAW)})
    for name in NAMES:
        assert ours.get(name) == theirs.get(name), name
        assert ours.get(name, "default") == theirs.get(name, "default"), name
        assert (name in ours) == (name in theirs), name
        assert ours.getlist(name) == theirs.getlist(name), name
        if name in theirs:
            assert ours[name] == theirs[name]
        else:
            with pytest.raises(KeyError):
                ours[name]
    assert ours.items() == theirs.items() and ours.raw == theirs.raw


def test_the_request_reads_its_headers_through_the_index() -> None:
    request = IndexedRequest({"type": "http", "headers": list(RAW)})
    assert isinstance(request.headers, IndexedHeaders) and request.headers is request.headers
    assert request.headers.get("x-priority") == "high"
