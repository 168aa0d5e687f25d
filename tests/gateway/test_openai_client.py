"""The real `openai` client (sync and async, streaming and not) against the gateway."""

from __future__ import annotations

import openai
import pytest

pytestmark = pytest.mark.e2e


@pytest.fixture
def base_url(start_backend, start_gateway):
    backend = start_backend()
    return start_gateway([backend.url]).url + "/v1"


MESSAGES = [{"role": "user", "content": "hello"}]


def test_sync_non_streaming(base_url):
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    resp = client.chat.completions.create(model="test-model", messages=MESSAGES, max_tokens=3)
    assert resp.choices[0].message.content == "t t t "
    assert resp.usage is not None and resp.usage.completion_tokens == 3


def test_sync_streaming_with_usage(base_url):
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model="test-model",
        messages=MESSAGES,
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "t0 t1 t2 "
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3


async def test_async_streaming_without_usage(base_url):
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    stream = await client.chat.completions.create(
        model="test-model", messages=MESSAGES, max_tokens=2, stream=True
    )
    chunks = [c async for c in stream]
    assert all(c.usage is None for c in chunks)
    assert [c.choices[0].finish_reason for c in chunks] == [None, None, None, "length"]
    await client.close()


async def test_async_non_streaming_and_models(base_url):
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    resp = await client.completions.create(model="test-model", prompt="hi", max_tokens=2)
    assert resp.usage is not None and resp.usage.total_tokens == 9
    models = await client.models.list()
    assert [m.id for m in models.data] == ["test-model"]
    await client.close()


def test_errors_surface_as_openai_exceptions(base_url):
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="missing", messages=MESSAGES)
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="test-model", messages=[])
    assert bad.value.param == "messages"
