"""A client of the suite's own redis-server for the allocator's and the registry's scripts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()
