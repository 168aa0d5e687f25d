"""Benchmark the estimate stage: time per request, header parser vs Pillow, text-estimator error.

    .venv/bin/python -m bench.estimate                      # timings
    .venv/bin/python -m bench.estimate --tokenizer tokenizer.json   # + error against a real BPE tokenizer

The tokenizer file is any local Hugging Face tokenizer.json (the `tokenizers` package must be installed);
nothing is downloaded. The error corpus is made from files on this machine: the shared design docs, the
Chinese seed articles, Python standard-library sources and generated JSON.
"""

from __future__ import annotations

import argparse
import base64
import glob
import io
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image

from gateway.estimate.blob import Blob
from gateway.estimate.estimator import Estimator
from gateway.estimate.media import image_size
from gateway.estimate.settings import BucketPolicy, EstimationPolicy
from gateway.estimate.text import estimate_text_tokens

SHARED = Path(__file__).resolve().parents[2] / "shared"


def per_call_us(fn: Callable[[], object], budget_s: float = 1.0, max_calls: int = 20_000) -> float:
    """Median of 5 rounds of the mean time per call, in microseconds (bounded in time and count)."""
    fn()
    start, calls = time.perf_counter(), 0
    while calls < 10 or (time.perf_counter() - start < budget_s / 5 and calls < max_calls // 5):
        fn()
        calls += 1
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(rounds)


def noise_image(fmt: str, target_bytes: int, **save: Any) -> bytes:
    """A random-noise image (incompressible) of about `target_bytes` once encoded."""
    side = 256
    while True:
        img = Image.frombytes("RGB", (side, side), random.Random(side).randbytes(side * side * 3))
        buf = io.BytesIO()
        img.save(buf, fmt, **save)
        if buf.tell() >= target_bytes:
            return buf.getvalue()
        side = int(side * 1.25)


def wav_30s() -> bytes:
    import wave

    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\x00\x01" * 16000 * 30)
    return buf.getvalue()


def english_text(tokens: int) -> str:
    words = (SHARED / "DESIGN.md").read_text().split()
    return " ".join(words[: int(tokens * 0.75)])


def bench_requests() -> list[tuple[str, float, str]]:
    est = Estimator(EstimationPolicy(), BucketPolicy())
    imgs = [
        noise_image("JPEG", 750_000, quality=95),
        noise_image("PNG", 750_000),
        noise_image("WEBP", 750_000, quality=95),
        noise_image("JPEG", 750_000, quality=95, progressive=True),
    ]
    parts = [
        {"type": "image_url", "image_url": {"url": "data:image/x;base64," + base64.b64encode(b).decode()}}
        for b in imgs
    ]
    b64_mb = statistics.mean(len(p["image_url"]["url"]) for p in parts) / 1e6
    audio = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(wav_30s()).decode(), "format": "wav"},
    }
    text = english_text(1000)
    cases = {
        "text, ~1k tokens": {"model": "m", "messages": [{"role": "user", "content": text}]},
        f"4 images, {b64_mb:.2f} MB base64 each": {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "compare"}, *parts]}],
        },
        "30 s WAV clip": {"model": "m", "messages": [{"role": "user", "content": [audio]}]},
    }
    rows = []
    for name, body in cases.items():
        cost, bucket = est.estimate(body, endpoint="chat", tenant="bench")
        us = per_call_us(lambda body=body: est.estimate(body, endpoint="chat", tenant="bench"))
        rows.append((name, us, f"{bucket}: prompt={cost.prompt_tokens}"))
    return rows


def bench_parsers() -> list[tuple[str, float, float, float]]:
    rows = []
    for fmt, save in [
        ("PNG", {}),
        ("JPEG", {"quality": 95}),
        ("WEBP", {"quality": 95}),
        ("GIF", {}),
        ("BMP", {}),
    ]:
        data = noise_image(fmt, 750_000, **save)
        text = base64.b64encode(data).decode()

        def pillow_full(text: str = text) -> tuple[int, int]:
            return Image.open(io.BytesIO(base64.b64decode(text))).size

        def pillow_prefix(text: str = text) -> tuple[int, int]:
            return Image.open(io.BytesIO(Blob(text).head(4096))).size

        try:
            pillow_prefix()
            prefix_us = per_call_us(pillow_prefix)
        except OSError:  # Pillow's WebP plugin hands the whole file to libwebp: a prefix is not enough
            prefix_us = float("nan")

        def hand(text: str = text) -> tuple[int, int]:
            return image_size(Blob(text))

        assert hand() == pillow_full(), fmt
        rows.append((fmt, per_call_us(hand), prefix_us, per_call_us(pillow_full)))
    return rows


def error_corpus(seed: int = 1) -> list[tuple[str, str]]:
    rng = random.Random(seed)

    def cut(text: str, n: int, lo: int, hi: int) -> list[str]:
        out = []
        for _ in range(n):
            size = rng.randint(lo, hi)
            start = rng.randint(0, max(0, len(text) - size))
            out.append(text[start : start + size])
        return out

    zh = "".join(Path(f).read_text() for f in sorted(glob.glob(str(SHARED / "seeds" / "*.txt"))))
    en = " ".join((SHARED / n).read_text() for n in ("BRIEF.md", "DESIGN.md", "REFERENCE.md"))
    code = "\n".join(
        Path(f).read_text() for f in sorted(glob.glob(json.__file__.rsplit("/", 1)[0] + "/*.py"))
    )
    js = json.dumps(
        [{"id": i, "name": f"item-{i}", "price": round(rng.random() * 100, 2)} for i in range(3000)]
    )
    return (
        [("zh", t) for t in cut(zh, 60, 50, 3000)]
        + [("en", t) for t in cut(en, 80, 200, 6000)]
        + [("code", t) for t in cut(code, 60, 200, 6000)]
        + [("json", t) for t in cut(js, 30, 200, 6000)]
    )


def text_error(tokenizer_json: str) -> list[tuple[str, int, float, float, float]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_json)
    by_kind: dict[str, list[float]] = {}
    for kind, text in error_corpus():
        real = len(tok.encode(text, add_special_tokens=False).ids)
        by_kind.setdefault(kind, []).append((estimate_text_tokens(text) - real) / real)
    by_kind["all"] = [e for errs in by_kind.values() for e in errs]
    rows = []
    for kind, errs in by_kind.items():
        abs_sorted = sorted(abs(e) for e in errs)
        p95 = abs_sorted[int(0.95 * (len(abs_sorted) - 1))]
        rows.append((kind, len(errs), statistics.mean(errs), statistics.mean(abs_sorted), p95))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", help="local tokenizer.json to measure the text estimator against")
    args = ap.parse_args()

    print("Estimator.estimate per request")
    print(f"  {'request':<34} {'µs':>9}  result")
    for name, us, result in bench_requests():
        print(f"  {name:<34} {us:>9.1f}  {result}")

    print("\nImage size from ~1 MB base64 (µs per image)")
    print(f"  {'format':<6} {'hand parser':>12} {'Pillow, 4 KB prefix':>20} {'Pillow, full decode':>20}")
    for fmt, hand, pre, full in bench_parsers():
        print(f"  {fmt:<6} {hand:>12.1f} {pre:>20.1f} {full:>20.1f}")

    if args.tokenizer:
        print("\nText estimate vs tokenizer (relative error: signed mean, mean |e|, p95 |e|)")
        for kind, n, mean, mae, p95 in text_error(args.tokenizer):
            print(f"  {kind:<5} n={n:<4} mean {mean:+.3f}  mae {mae:.3f}  p95 {p95:.3f}")


if __name__ == "__main__":
    main()
