"""The simulator's `/v1/embeddings` with the real openai client: the vectors' shape and encodings, usage
counted by the simulator's own counter, the prefill run on the engine, SGLang's error answers."""

from __future__ import annotations

import math
from collections.abc import Iterator

import httpx
import openai
import pytest

from loadtest.sim.config import SimConfig
from loadtest.sim.embeddings import DEFAULT_DIMENSIONS, vector
from loadtest.sim.profile import load_profile
from loadtest.sim.server import create_app
from loadtest.sim.tokens import PromptCounter
from tests.support.servers import ServerThread, serve

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def sim() -> Iterator[ServerThread]:
    with serve(create_app(SimConfig(time_scale=200.0, seed=5))) as server:
        yield server


def _prompt_tokens_total(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("sglang:prompt_tokens_total")
    )


def test_embeddings_through_the_openai_client_in_both_encodings(sim: ServerThread) -> None:
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="sk-x", max_retries=0)
    counter = PromptCounter(load_profile("default"))
    texts = ["The harbour at dawn.", "九龍の港"]
    before = _prompt_tokens_total(sim.url)
    packed = client.embeddings.create(model="emb", input=texts)  # the SDK asks for base64 and decodes it
    plain = client.embeddings.create(model="emb", input=texts, encoding_format="float", dimensions=8)
    assert [d.index for d in packed.data] == [0, 1]
    assert [len(d.embedding) for d in packed.data] == [DEFAULT_DIMENSIONS] * 2
    assert all(math.isclose(sum(x * x for x in d.embedding), 1.0, rel_tol=1e-5) for d in packed.data)
    for got, text in zip(packed.data, texts, strict=True):  # float32 round trip
        assert got.embedding == pytest.approx(vector(text, DEFAULT_DIMENSIONS), abs=1e-6)
    assert [d.embedding for d in plain.data] == [vector(t, 8) for t in texts]
    tokens = sum(counter.text(t) for t in texts)
    assert (packed.usage.prompt_tokens, packed.usage.total_tokens, packed.model) == (tokens, tokens, "emb")
    assert _prompt_tokens_total(sim.url) - before == 2 * tokens  # each input was prefilled on the engine


def test_token_id_inputs_and_sglang_errors(sim: ServerThread) -> None:
    r = httpx.post(sim.url + "/v1/embeddings", json={"model": "emb", "input": [[1, 2, 3], [4, 5]]})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 5
    bad = httpx.post(sim.url + "/v1/embeddings", json={"model": "emb", "input": []})
    assert bad.status_code == 400 and bad.json()["object"] == "error"
    long = httpx.post(sim.url + "/v1/embeddings", json={"model": "emb", "input": list(range(200_000))})
    assert long.status_code == 400 and "longer than the model's context length" in long.json()["message"]
