"""Price one media item (image, video, audio clip) from its content-part value.

Each function returns (tokens, remote): `remote` is True when the item is a URL we priced from a hint or
policy default instead of reading it. Every value enters through `media_source`, which applies the pool's
media URL policy first (gateway/request/media_urls.py: MediaUrlRefused). Bad input raises
MediaError/HeaderError with a reason; the caller (content.py) adds where in the request it happened.
"""

from __future__ import annotations

from gateway.estimate import imagehead
from gateway.estimate.audio import audio_tokens, clip_seconds
from gateway.estimate.blob import Blob, MediaError, Source, parse_source
from gateway.estimate.imagehead import HeaderError
from gateway.estimate.settings import EstimationPolicy, ModelProfile
from gateway.estimate.vision import image_tokens, video_tokens
from gateway.request.media_urls import MediaUrlPolicy, check_media_url

# Prefix lengths tried in turn: almost every header fits the first; JPEGs with big EXIF/ICC need more.
_PREFIXES = (64, 4096, 65_536, 1 << 20)


def media_source(value: str, urls: MediaUrlPolicy) -> Source:
    """Where a media value lives, once the pool's URL policy allows the engine to be handed it: the one
    door every media item of a request goes through, whatever part or list of the request it came from."""
    check_media_url(value, urls)
    return parse_source(value)


def image_size(blob: Blob) -> tuple[int, int]:
    """(width, height) of an inline image, reading only as much of it as its header needs."""
    total = blob.size()
    head = blob.head(_PREFIXES[0])
    fmt = imagehead.sniff(head)
    if fmt is None:
        raise HeaderError("unsupported image format (expected PNG, JPEG, WebP, GIF or BMP)")
    size = None
    for n in (*_PREFIXES, total):
        head = blob.head(n)
        size = imagehead.read_size(fmt, head)
        if size is not None or len(head) >= total:
            break
    if size is None:
        raise HeaderError(f"{fmt.upper()} image is truncated before its size")
    if imagehead.is_truncated(fmt, head, blob.tail(64), total):
        raise HeaderError(f"{fmt.upper()} image is truncated")
    w, h = size
    if w <= 0 or h <= 0:
        raise HeaderError(f"{fmt.upper()} image declares a zero size ({w}x{h})")
    return w, h


def price_image(
    url: str, detail: str | None, profile: ModelProfile, policy: EstimationPolicy, urls: MediaUrlPolicy
) -> tuple[int, bool]:
    source = media_source(url, urls)
    if source.blob is None:
        w, h = policy.remote_image_low_detail_size if detail == "low" else policy.remote_image_default_size
        return image_tokens(profile, w, h), True
    w, h = image_size(source.blob)
    if w * h > policy.max_image_pixels:
        raise MediaError(f"{w}x{h} exceeds the {policy.max_image_pixels}-pixel limit")
    return image_tokens(profile, w, h), False


def price_video(
    url: str,
    profile: ModelProfile,
    policy: EstimationPolicy,
    urls: MediaUrlPolicy,
    *,
    seconds: float | None,
    fps: float | None,
    size: tuple[int, int] | None,
) -> tuple[int, bool]:
    """Videos are never parsed: declared duration/fps/size, else the policy's defaults."""
    source = media_source(url, urls)
    w, h = size or policy.video_default_size
    tokens = video_tokens(profile, w, h, seconds or policy.video_default_seconds, fps)
    return tokens, source.blob is None


def price_audio(
    url_or_b64: str, profile: ModelProfile, policy: EstimationPolicy, urls: MediaUrlPolicy
) -> tuple[int, bool]:
    source = media_source(url_or_b64, urls)
    if source.blob is None:
        return audio_tokens(profile.audio, policy.audio_default_seconds), True
    seconds = clip_seconds(source.blob, policy.compressed_audio_kbps)
    return audio_tokens(profile.audio, seconds), False
