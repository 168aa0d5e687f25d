"""Gateway in front of the simulated SGLang Omni backend: pricing, buckets and early rejections end to end."""

from __future__ import annotations

import base64
import io
from contextlib import ExitStack

import httpx
import pytest
from PIL import Image

from gateway.estimate.estimator import Estimator
from gateway.http.app import create_app
from gateway.livepolicy.policy import Policy
from loadtest.sim.config import SimConfig
from loadtest.sim.server import create_app as create_sim
from tests.gateway.conftest import gateway_config
from tests.support.servers import serve

pytestmark = pytest.mark.e2e

MODEL = "qwen2.5-omni-7b"


def _png(width: int, height: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _chat(parts: list[dict], **extra) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": parts}],
        "max_tokens": 8,
        "ignore_eos": True,
        **extra,
    }


@pytest.fixture(scope="module")
def gw_url(tmp_path_factory):
    policy = tmp_path_factory.mktemp("policy") / "policy.yaml"
    policy.write_text("version: 1\n")
    with ExitStack() as stack:
        sim = stack.enter_context(serve(create_sim(SimConfig(model=MODEL, time_scale=200, seed=1))))
        pool = {"name": "interactive", "models": [MODEL], "backends": [sim.url], "health_interval_s": 0.2}
        config = gateway_config([sim.url], policy, pools=[pool])
        gw = stack.enter_context(serve(create_app(config)))
        yield gw.url


@pytest.mark.parametrize(
    ("sizes", "bucket"),
    [([], "text"), ([(640, 480)], "single_image"), ([(1920, 1080), (333, 517), (28, 28)], "multi_image")],
)
def test_prompt_price_matches_the_backend_count_and_headers_show_it(gw_url, sizes, bucket):
    parts: list[dict] = [{"type": "text", "text": "Describe what you see in detail, please."}]
    parts += [{"type": "image_url", "image_url": {"url": _png(w, h)}} for w, h in sizes]
    body = _chat(parts)
    cost, expected_bucket = Estimator(Policy().estimation, Policy().buckets).estimate(
        body, endpoint="chat", tenant="anonymous"
    )
    resp = httpx.post(gw_url + "/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-omnigate-bucket"] == bucket == expected_bucket
    assert int(resp.headers["x-omnigate-estimated-tokens"]) == cost.total_tokens
    backend_prompt = resp.json()["usage"]["prompt_tokens"]
    if sizes:  # vision tokens are exact; the text part is estimated independently on both sides
        text_only = Estimator(Policy().estimation, Policy().buckets).estimate(
            _chat(parts[:1]), endpoint="chat", tenant="anonymous"
        )[0]
        sim_text = httpx.post(gw_url + "/v1/chat/completions", json=_chat(parts[:1]), timeout=30)
        sim_vision = backend_prompt - sim_text.json()["usage"]["prompt_tokens"]
        assert sim_vision == cost.vision_tokens
        assert cost.text_tokens == text_only.text_tokens
    assert abs(cost.prompt_tokens - backend_prompt) <= 0.15 * backend_prompt


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("data:image/png;base64,!!!notbase64!!!", "invalid_image"),
        (
            "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 10).decode(),
            "invalid_image",
        ),
        ("data:image/png;base64," + base64.b64encode(b"GIF89a").decode(), "invalid_image"),
    ],
)
def test_bad_images_are_refused_before_the_backend(gw_url, url, code):
    body = _chat([{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": url}}])
    resp = httpx.post(gw_url + "/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["code"] == code
    assert err["param"].startswith("messages[0].content[1]")


def test_absurd_declared_dimensions_are_refused_without_allocation(gw_url):
    # a PNG header that claims 100000×100000; only its IHDR is read
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    png = (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", 13)
        + b"IHDR"
        + ihdr
        + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
        + struct.pack(">I", 0)
        + b"IEND"
        + struct.pack(">I", zlib.crc32(b"IEND"))
    )
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    body = _chat([{"type": "image_url", "image_url": {"url": url}}])
    resp = httpx.post(gw_url + "/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["code"] == "invalid_image"
    assert err["param"] == "messages[0].content[0]"
    assert "100000x100000 exceeds the 178956970-pixel limit" in err["message"]


def test_too_many_images_and_context_overflow_are_400(gw_url):
    tiny = _png(28, 28)
    many = _chat([{"type": "image_url", "image_url": {"url": tiny}}] * 33)
    resp = httpx.post(gw_url + "/v1/chat/completions", json=many, timeout=30)
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "too_many_images"
    huge = {"model": MODEL, "messages": [{"role": "user", "content": "word " * 60000}]}
    resp = httpx.post(gw_url + "/v1/chat/completions", json=huge, timeout=30)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["code"] == "context_length_exceeded"
    assert "longer than the model's context length" in err["message"]
