"""Closed-loop capacity of the omni pipeline model, straight on the pure pipeline (no HTTP, virtual time).

`python -m loadtest.sim.omni.capacity [--releases snapshot,later] [--concurrency 1,2,4,8,16,32]`: for each
release and concurrency c, c clients send chats back to back for `--duration` virtual seconds (a share
`--text-share` of them text-only, the rest asking for audio); the table shows, over the requests that arrive
after `--warmup`: audio seconds made per second, per-stream RTF (e2e ÷ audio seconds, sglang-omni's benchmark
definition: above 1 is slower than real time), time to first audio, text TTFT (the thinker's first token),
how long text-only answers take to finish, and the share of audio streams that stall during playback (a
chunk arrives after the audio before it has played).
These are the figures the gateway's staged budgets and the speech benchmark are judged against.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass, field

from loadtest.metrics import percentile
from loadtest.sim.omni.pipeline import Job, OmniPipeline, answer_tokens
from loadtest.sim.omni.profile import OmniProfile, Release, load_omni_profile
from loadtest.sim.omni.prompt import OmniPrompt
from loadtest.sim.omni.release import BEHAVIOURS

PROMPT_TOKENS = 120  # a short spoken question plus the chat template


@dataclass
class Stream:
    """One audio answer as a listener would play it."""

    arrival: float
    chunks: list[tuple[float, float]] = field(default_factory=list)  # (arrival time, seconds of audio)

    def stalls(self) -> bool:
        """Playback starts at the first chunk; True if a chunk comes after the audio before it has run out."""
        if not self.chunks:
            return False
        played_until = self.chunks[0][0]
        for t, seconds in self.chunks:
            if t > played_until + 1e-9:
                return True
            played_until += seconds
        return False


@dataclass
class Point:
    concurrency: int
    audio_per_s: float
    rtf: list[float]
    ttfa: list[float]
    ttft: list[float]
    text_e2e: list[float]  # whole answers of the text-only requests
    stalled: float
    requests: int


def run_point(
    profile: OmniProfile,
    release: Release,
    c: int,
    duration: float,
    warmup: float,
    text_share: float,
    seed: int,
) -> Point:
    rng = random.Random(seed)
    pipeline = OmniPipeline(
        profile, release, text_only_skips_audio_stages=BEHAVIOURS[release].text_only_skips_audio_stages
    )
    streams: dict[str, Stream] = {}
    counter = 0

    def send(t: float) -> None:
        nonlocal counter
        counter += 1
        audio_out = rng.random() >= text_share
        job = Job(f"r{counter}", "chat", OmniPrompt(text=PROMPT_TOKENS), 2048, 0, audio_out)
        job.text_tokens = answer_tokens(rng, profile.output)
        job.preprocess_s = profile.preprocessing.base_s
        job.arrival = t
        pipeline.submit(job)
        if audio_out:
            streams[job.rid] = Stream(t)

    for i in range(c):
        send(i * 0.05)  # clients start 50 ms apart
    sample_rate = profile.speech.sample_rate
    while (record := pipeline.step()) is not None:
        for event in record.events:
            if event.kind == "audio" and event.rid in streams:
                streams[event.rid].chunks.append((event.time, event.value / sample_rate))
            elif event.kind in ("done", "failed") and event.time < duration:
                send(event.time)
    measured = [r for r in pipeline.recent if warmup <= r["arrival"] < duration]
    audio = [r for r in measured if r["audio_delivered"] and r["audio_seconds"] > 0]
    made = sum(r["audio_seconds"] for r in pipeline.recent if warmup <= r["arrival"] < duration)
    stalled = sum(streams[r["rid"]].stalls() for r in audio)
    return Point(
        c,
        made / (duration - warmup),
        [r["e2e_s"] / r["audio_seconds"] for r in audio],
        [r["first_audio_s"] for r in audio],
        [r["first_text_s"] for r in measured if r["first_text_s"] is not None],
        [r["e2e_s"] for r in measured if not r["audio_delivered"] and r["e2e_s"] is not None],
        stalled / len(audio) if audio else 0.0,
        len(measured),
    )


def _q(values: list[float], q: float, scale: float = 1.0, digits: int = 2) -> str:
    return f"{percentile(values, q) * scale:.{digits}f}" if values else "-"


def table(points: list[Point]) -> str:
    lines = [
        "| clients | requests | audio s/s | RTF P50 | RTF P99 | TTFA P50 ms | TTFA P99 ms "
        "| text TTFT P99 ms | text-only e2e P99 s | streams that stall |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        lines.append(
            f"| {p.concurrency} | {p.requests} | {p.audio_per_s:.1f} | {_q(p.rtf, 50)} | {_q(p.rtf, 99)} | "
            f"{_q(p.ttfa, 50, 1000, 0)} | {_q(p.ttfa, 99, 1000, 0)} | {_q(p.ttft, 99, 1000, 0)} | "
            f"{_q(p.text_e2e, 99, 1, 1)} | "
            f"{p.stalled:.0%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--profile", default="qwen3-omni")
    ap.add_argument("--releases", default="snapshot,later")
    ap.add_argument("--concurrency", default="1,2,4,8,16,24,32")
    ap.add_argument("--duration", type=float, default=600.0, help="virtual seconds of load per point")
    ap.add_argument("--warmup", type=float, default=60.0)
    ap.add_argument("--text-share", type=float, default=0.0, help="share of text-only chats")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    profile = load_omni_profile(args.profile)
    releases: list[Release] = []
    for name in args.releases.split(","):
        if name not in ("snapshot", "later"):
            ap.error(f"unknown release {name!r}")
        releases.append("snapshot" if name == "snapshot" else "later")
    for release in releases:
        points = [
            run_point(profile, release, int(c), args.duration, args.warmup, args.text_share, args.seed)
            for c in args.concurrency.split(",")
        ]
        print(f"\n{release}: {args.duration:.0f} s per point, text share {args.text_share:.0%}\n")
        print(table(points))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
