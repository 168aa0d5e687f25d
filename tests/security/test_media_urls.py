"""The media URL policy: what a tenant may make a pool's engines fetch, checked on every media value.

Every test goes through the estimator's one entry point with a policy parsed from a policy file's text,
as the gateway does; the gateway-level refusals over HTTP are in test_threat_model.py.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from gateway.estimate.estimator import Estimator
from gateway.livepolicy.policy import Policy, PolicyError, load_policy_text
from gateway.request.errors import ApiError
from gateway.request.media_urls import PATH_MAX, MediaUrlPolicy
from tests.estimate.helpers import chat, data_uri, image_bytes, image_part, wav_bytes

POLICY = load_policy_text(
    """
version: 1
pool_defaults:
  media_urls:
    allow: [cdn.example.com, "*.img.example.org", "https://files.example.net:8443/pub/", 10.9.8.7]
pools:
  open:
    media_urls: {allow_public_hosts: true}
"""
)
LISTED = POLICY.pool("interactive").media_urls
PUBLIC = POLICY.pool("open").media_urls
EST = Estimator(Policy().estimation, Policy().buckets)

LOCAL_URLS = [
    "http://127.0.0.1/a.png",
    "http://127.1/a.png",
    "http://2130706433/a.png",  # decimal
    "http://0177.0.0.1/a.png",  # octal
    "http://0x7f.0.0.1/a.png",  # hex
    "http://0x7f000001/a.png",
    "http://127.0.0.1./a.png",  # trailing dot
    "HTTP://LOCALHOST/a.png",
    "http://localhost:8000/a.png",
    "http://api.localhost/a.png",
    "http://[::1]/a.png",
    "http://[::ffff:127.0.0.1]/a.png",  # IPv4-mapped IPv6
    "http://[::ffff:7f00:1]/a.png",
    "http://[64:ff9b::a9fe:a9fe]/latest",  # NAT64 of the metadata address
    "http://[2002:a9fe:a9fe::]/latest",  # 6to4 of the metadata address
    "http://169.254.169.254/latest/meta-data/",  # AWS, GCP, Azure metadata
    "http://[fd00:ec2::254]/latest/meta-data/",  # AWS IPv6 metadata
    "http://100.100.100.200/latest/meta-data/",  # Alibaba Cloud metadata
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://10.0.0.5/a.png",
    "http://172.16.3.4/a.png",
    "http://192.168.1.1/a.png",
    "http://[fe80::1]/a.png",
    "http://[fc00::1]/a.png",
    "http://0.0.0.0:8080/a.png",
    "http://0/a.png",
    "http://redis:6379/",  # single label: resolved inside the engine's network
    "http://printer.local/a.png",
]
MALFORMED_URLS = [
    ("http://user:pw@cdn.example.com/a.png", "URL carries credentials"),
    ("http://cdn.example.com@127.0.0.1/a.png", "URL carries credentials"),
    ("http://cdn.example.com\\@127.0.0.1/a.png", "a backslash"),
    ("http://%31%32%37.0.0.1/a.png", "URL host is percent-encoded"),
    ("http://１２７.0.0.1/a.png", "URL host is not ASCII"),  # IDNA would make fullwidth digits 127.0.0.1
    ("http://1.2.3.4.5/a.png", "malformed IPv4 address"),
    ("http://cdn.example.com/%2e%2e/a.png", "'..' segments"),
    (" http://cdn.example.com/a.png", "whitespace"),
    ("http:/cdn.example.com/a.png", "not an http(s) URL"),
    ("http://cdn.example.com:99999/a.png", "port is out of range"),
]
OTHER_SCHEMES = [
    ("file:///etc/passwd", "'file:' URLs are not allowed"),
    ("FILE:///etc/passwd", "'file:' URLs are not allowed"),
    ("ftp://cdn.example.com/a.png", "'ftp:' URLs are not allowed"),
    ("gopher://127.0.0.1:6379/_INFO", "'gopher:' URLs are not allowed"),
    ("dict://127.0.0.1:11211/stats", "'dict:' URLs are not allowed"),
    ("C:\\Windows\\win.ini", "'c:' URLs are not allowed"),
    ("DATA:image/png;base64,iVBORw0KGgo=", "lower-case 'data:'"),
]
BARE_PATHS = [
    "/etc/passwd",
    "//////etc/passwd",  # base64 characters only, length a multiple of 4
    "etc///passwd",  # relative, the same
    "./secret.wav",
    "../../root/x.png",
    "~/x.png",
    "/proc/self/environ",
]


def parts(value: str) -> list[tuple[dict[str, Any], str]]:
    """The value in every content part that carries media, with the param a refusal must name."""
    return [
        (image_part(value), "messages[0].content[0].image_url.url"),
        ({"type": "audio_url", "audio_url": {"url": value}}, "messages[0].content[0].audio_url.url"),
        ({"type": "input_audio", "input_audio": {"data": value}}, "messages[0].content[0].input_audio.data"),
        ({"type": "video_url", "video_url": {"url": value}}, "messages[0].content[0].video_url.url"),
    ]


INLINE_ITEMS = {
    "images": data_uri(image_bytes("PNG", 8, 8)),
    "audios": data_uri(wav_bytes(0.1), "audio/wav"),
    "videos": data_uri(b"x" * 3, "video/mp4"),
}


def refusal(body: dict[str, Any], urls: MediaUrlPolicy) -> ApiError:
    with pytest.raises(ApiError) as info:
        EST.estimate(body, endpoint="chat", tenant="t", urls=urls)
    return info.value


def assert_refused(value: str, urls: MediaUrlPolicy, reason: str) -> None:
    for part, param in parts(value):
        err = refusal(chat(part), urls)
        assert (err.status, err.code, err.param) == (400, "media_url_not_allowed", param), value
        assert err.message.startswith(f"{param}: media URL not allowed: "), err.message
        assert reason in err.message, err.message
    for key, inline in INLINE_ITEMS.items():  # a valid inline item first: the refused one is the second
        err = refusal({**chat({"type": "text", "text": "hi"}), key: [inline, value]}, urls)
        assert (err.status, err.code, err.param) == (400, "media_url_not_allowed", f"{key}[1]"), value


@pytest.mark.parametrize("url", LOCAL_URLS)
@pytest.mark.parametrize("urls", [LISTED, PUBLIC], ids=["allow-list", "public-hosts"])
def test_local_addresses_and_names_are_refused_in_every_spelling(url: str, urls: MediaUrlPolicy) -> None:
    assert_refused(url, urls, "the engine may not be sent there")


@pytest.mark.parametrize(("url", "reason"), MALFORMED_URLS)
def test_urls_that_parsers_read_two_ways_are_refused(url: str, reason: str) -> None:
    assert_refused(url, PUBLIC, reason)


@pytest.mark.parametrize(("value", "reason"), OTHER_SCHEMES)
def test_schemes_other_than_http_are_refused(value: str, reason: str) -> None:
    assert_refused(value, PUBLIC, reason)


@pytest.mark.parametrize("value", BARE_PATHS)
def test_bare_paths_are_refused(value: str) -> None:
    assert_refused(value, PUBLIC, "could name a file on the engine's host")


def test_hosts_off_the_allow_list_are_refused_and_listed_ones_priced() -> None:
    assert_refused("https://evil.example.com/a.png", LISTED, "not on this pool's media URL allow-list")
    assert_refused("https://files.example.net:8443/private/a.png", LISTED, "not on this pool's")
    assert_refused("https://files.example.net/pub/a.png", LISTED, "not on this pool's")  # port 443
    assert_refused("https://img.example.org/a.png", LISTED, "not on this pool's")  # the wildcard's parent
    listed = [
        "https://cdn.example.com/a.png",
        "http://cdn.example.com:8080/b.jpg",
        "https://x.img.example.org/a.png",
        "https://a.b.img.example.org/a.png",
        "https://files.example.net:8443/pub/a/b.png",
        "http://10.9.8.7/a.png",  # an internal address the operator named exactly
        "http://012.011.010.07/a.png",  # the same address, octal
    ]
    for url in listed:
        cost, bucket = EST.estimate(chat(image_part(url)), endpoint="chat", tenant="t", urls=LISTED)
        assert (cost.remote_media, bucket) == (1, "single_image"), url
    assert_refused("http://10.9.8.8/a.png", PUBLIC, "a private address")


def test_public_hosts_pass_only_with_the_flag() -> None:
    for url in ("https://example.com/a.png", "https://8.8.8.8/a.png", "https://[2606:4700::1111]/a.png"):
        assert_refused(url, MediaUrlPolicy(), "not on this pool's media URL allow-list")
        cost, _ = EST.estimate(chat(image_part(url)), endpoint="chat", tenant="t", urls=PUBLIC)
        assert cost.remote_media == 1


def test_inline_media_is_unaffected() -> None:
    png = image_bytes("PNG", 64, 48)
    jpeg = image_bytes("JPEG", 700, 700)  # raw base64 of a JPEG starts '/9j/': long enough to be content
    raw_jpeg = base64.b64encode(jpeg).decode()
    assert raw_jpeg.startswith("/9j/") and len(raw_jpeg) >= PATH_MAX
    wav = base64.b64encode(wav_bytes(1.0)).decode()
    for urls in (MediaUrlPolicy(), LISTED):
        body = chat(
            image_part(data_uri(png)),
            image_part(raw_jpeg),
            {"type": "input_audio", "input_audio": {"data": wav}},
            {
                "type": "audio_url",
                "audio_url": {"url": "data:audio/wav;base64," + wav},
            },
        )
        cost, bucket = EST.estimate(body, endpoint="chat", tenant="t", urls=urls)
        assert (cost.images, cost.audios, cost.remote_media, bucket) == (2, 2, 0, "audio")


def test_a_short_raw_base64_value_with_a_slash_asks_for_a_data_uri() -> None:
    small = base64.b64encode(image_bytes("JPEG", 8, 8)).decode()  # '/9j/…', a few hundred characters
    err = refusal(chat(image_part(small)), PUBLIC)
    assert "send inline media as a data: URI" in err.message
    cost, _ = EST.estimate(chat(image_part("data:image/jpeg;base64," + small)), endpoint="chat", tenant="t")
    assert cost.images == 1


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("https://files.example.net/pub", "a URL prefix ends with '/'"),
        ("https://files.example.net/pub/?x=1", "a URL prefix ends with '/'"),
        ("*.com", "a wildcard names a domain"),
        ("*", "malformed host name"),
        ("cdn.example.com:8080", "a host entry names no port"),
        ("ftp://files.example.net/pub/", "not an http(s) URL"),
        ("http://user@files.example.net/pub/", "credentials"),
    ],
)
def test_allow_entries_that_cannot_match_fail_the_policy_file(entry: str, reason: str) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy_text(f"version: 1\npool_defaults:\n  media_urls:\n    allow: [{entry!r}]\n")
    assert "pool_defaults.media_urls.allow" in str(info.value)
    assert reason in str(info.value)
