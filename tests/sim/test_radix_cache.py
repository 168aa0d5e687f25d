"""The simulator's radix cache (radix_cache.py, engine.py with `radix_cache`): a repeated prefix is not
prefilled again, its images are not encoded again, it is locked while used and evicted LRU under KV
pressure; `cached_tokens` reaches the usage with --enable-cache-report."""

from __future__ import annotations

import base64
import io
from typing import Any

import pytest
from PIL import Image
from starlette.testclient import TestClient

from loadtest.sim.config import SimConfig
from loadtest.sim.engine import Engine, EngineConfig, SimRequest
from loadtest.sim.profile import load_profile
from loadtest.sim.radix_cache import PromptPages, RadixCache
from loadtest.sim.server import create_app
from loadtest.sim.tokens import PromptCounter
from tests.sim.test_engine import COSTS as ENGINE_COSTS

# test_engine's round-number costs, with 1 ms per encoder token: prefill = 10 ms + 1 ms per computed token
# + 1 ms per encoder token; decode = 10 ms flat
COSTS = ENGINE_COSTS.model_copy(update={"encoder_per_token_s": 0.001})


def _pages(*parts: tuple[str, int, int]) -> PromptPages:
    pages = PromptPages()
    for name, tokens, encoder in parts:
        pages.add(name.encode(), tokens, encoder)
    return pages


SYSTEM, IMAGE, TURN1, TURN2 = ("system", 100, 0), ("image", 300, 300), ("turn1", 50, 0), ("turn2", 50, 0)


def _req(rid: str, pages: PromptPages, out: int = 2) -> SimRequest:
    prompt = sum(p.tokens for p in pages.pages)
    encoder = sum(p.encoder for p in pages.pages)
    return SimRequest(rid, prompt, out, out, encoder_tokens=encoder, pages=pages.pages)


def _engine(total: int = 10_000) -> Engine:
    return Engine(EngineConfig(max_total_tokens=total, max_running_requests=8, radix_cache=True), COSTS)


def _run(e: Engine, r: SimRequest) -> float:
    """Submit `r` alone and run it to its end; its prefill step's seconds."""
    e.submit(r)
    prefill = e.step()
    assert prefill is not None and prefill.kind == "prefill"
    while e.has_work():
        e.step()
    return prefill.end - prefill.start


def test_a_later_turn_prefills_only_what_follows_the_cached_prefix_and_skips_its_images() -> None:
    e = _engine()
    first = _req("a", _pages(SYSTEM, IMAGE, TURN1))
    assert _run(e, first) == pytest.approx(0.010 + 0.450 + 0.300)  # every token, the image encoded
    assert first.cached_tokens == 0
    second = _req("b", _pages(SYSTEM, IMAGE, TURN1, TURN2))
    assert _run(e, second) == pytest.approx(0.010 + 0.050)  # only turn2: no encoder either
    assert second.cached_tokens == 450
    assert e.cache is not None and e.cache.size == 500 and e.used_tokens == 0
    assert e.cache.hit_rate == pytest.approx(450 / (450 + 500))


def test_the_prompts_last_token_is_always_computed() -> None:
    e = _engine()
    _run(e, _req("a", _pages(SYSTEM, TURN1)))
    again = _req("b", _pages(SYSTEM, TURN1))
    _run(e, again)
    assert again.cached_tokens == 100  # not 150: the last page holds the token that samples the answer


def test_a_running_requests_prefix_is_locked_and_counted_as_used() -> None:
    e = _engine()
    _run(e, _req("a", _pages(SYSTEM, TURN1)))
    assert e.cache is not None and (e.used_tokens, e.evictable_tokens) == (0, 150)
    b = _req("b", _pages(SYSTEM, TURN2), out=5)
    e.submit(b)
    e.step()
    assert (e.cache.locked, e.used_tokens) == (100, 100 + 50)  # its prefix + its own 50
    assert e.evictable_tokens == 50
    while e.has_work():
        e.step()
    assert (e.used_tokens, e.cache.locked, e.evictable_tokens) == (0, 0, 200)


def test_kv_pressure_evicts_the_least_recently_used_pages_first() -> None:
    e = _engine(total=1000)
    _run(e, _req("a", _pages(("a1", 200, 0), ("a2", 200, 0))))
    _run(e, _req("b", _pages(("b1", 200, 0), ("b2", 200, 0))))
    assert e.cache is not None and e.cache.size == 800
    _run(e, _req("c", _pages(("c1", 300, 0))))  # needs 300 + its output: the oldest chain's deepest page goes
    assert e.kv_held <= 1000
    assert e.cache.match(_pages(("a1", 200, 0), ("a2", 200, 0)).pages, 1000).tokens == 200
    assert e.cache.match(_pages(("b1", 200, 0), ("b2", 200, 0)).pages, 1000).tokens == 400


def test_pages_follow_messages_text_and_image_content() -> None:
    counter = PromptCounter(load_profile("default"), pages=True)
    image = _png(64, 48)
    turn1 = [{"role": "system", "content": "Be brief. " * 60}, _user(image, "What is this?")]
    turn2 = [*turn1, {"role": "assistant", "content": "A square."}, {"role": "user", "content": "Colour?"}]
    one, two = counter.chat(turn1), counter.chat(turn2)
    assert one.pages is not None and two.pages is not None
    assert sum(p.tokens for p in one.pages.pages) == one.total  # the pages add up to the prompt
    assert [p.key for p in two.pages.pages[: len(one.pages.pages)]] == [p.key for p in one.pages.pages]
    other = counter.chat([turn1[0], _user(_png(64, 50), "What is this?")])
    assert other.pages is not None
    (img_one,) = [p for p in one.pages.pages if p.encoder]
    (img_other,) = [p for p in other.pages.pages if p.encoder]
    assert img_one.key != img_other.key and img_one.tokens == one.image_tokens + one.markers


def _png(w: int, h: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (200, 10, 10)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _user(image: str, text: str) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": text}],
    }


@pytest.mark.parametrize("report", [True, False])
def test_usage_reports_cached_tokens_only_with_the_cache_report_flag(report: bool) -> None:
    app = create_app(
        SimConfig(profile="default", radix_cache=True, enable_cache_report=report, time_scale=100)
    )
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hello there " * 200}]}
    with TestClient(app) as client:
        first = client.post("/v1/chat/completions", json=body).json()["usage"]
        stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
        with client.stream("POST", "/v1/chat/completions", json=stream) as resp:
            events = [line for line in resp.iter_lines() if line.startswith("data: {")]
    second = __import__("json").loads(events[-1][6:])["usage"]
    if report:
        assert first["prompt_tokens_details"] == {"cached_tokens": 0}
        cached = second["prompt_tokens_details"]["cached_tokens"]
        assert 0 < cached < second["prompt_tokens"] == first["prompt_tokens"]
    else:
        assert first["prompt_tokens_details"] is None and second["prompt_tokens_details"] is None


def test_the_tree_alone_never_holds_more_than_was_inserted() -> None:
    cache = RadixCache()
    pages = _pages(SYSTEM, TURN1).pages
    assert cache.insert(pages) == 150 and cache.insert(pages) == 0
    assert cache.evict(10) == 50 and cache.size == 100  # a whole page, the deepest
