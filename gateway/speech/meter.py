"""One answer's audio as it reaches the client: time to first audio, audio seconds, real-time factor, stalls.

Definitions (docs/decisions/0250-speech-through-the-relay.md):
- **real-time factor (RTF)** = wall seconds between the first and the last audio chunk ÷ audio seconds of all
  chunks but the last: the time the stream took to deliver its audio per second of that audio. Below 1 a
  player that starts at the first chunk is, over the stream, ahead of playback; above 1 the stream is slower
  than real time and stutters. (The issue speaks of audio seconds per wall second, the inverse; a factor
  where lower is better makes "P99 under 1" the tail that matters.) A one-chunk answer has none.
- **stall**: a chunk that arrives after the audio before it has finished playing, for a player that starts
  at the first chunk and resumes at each late one.
- **speed** (while it streams): audio seconds per wall second over its last few chunks — what the server
  makes for this stream now; admission sums it over a backend's streams (gateway/admission/engine_stages.py).
"""

from __future__ import annotations

from collections import deque

RECENT_CHUNKS = 6  # the speed is taken over the last five gaps: a burst of chunks read at once evens out


class SpeechMeter:
    __slots__ = (
        "_play_until",
        "_recent",
        "before_last",
        "chunks",
        "first_at",
        "last_at",
        "seconds",
        "stalls",
    )

    def __init__(self) -> None:
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.seconds = 0.0
        self.before_last = 0.0  # seconds of every chunk but the latest
        self.chunks = 0
        self.stalls = 0
        self._play_until = 0.0
        self._recent: deque[tuple[float, float]] = deque(maxlen=RECENT_CHUNKS)  # (arrival, seconds so far)

    def add(self, now: float, seconds: float) -> None:
        """One audio chunk of `seconds` reached the client at `now`."""
        if self.first_at is None:
            self.first_at = now
            self._play_until = now
        elif now > self._play_until:
            self.stalls += 1
            self._play_until = now
        self._play_until += seconds
        self.before_last = self.seconds
        self.seconds += seconds
        self.last_at = now
        self.chunks += 1
        self._recent.append((now, self.seconds))

    def speed(self, now: float) -> float | None:
        """Audio seconds per wall second the stream got over its recent chunks; None before two chunks
        came apart. A stream whose next chunk is later than its usual gap slows as the gap grows."""
        if len(self._recent) < 2:
            return None
        (first_at, first_seconds), (last_at, last_seconds) = self._recent[0], self._recent[-1]
        span = last_at - first_at
        if span <= 0:
            return None
        usual_gap = span / (len(self._recent) - 1)
        return (last_seconds - first_seconds) / max(span, now - first_at - usual_gap)

    @property
    def rtf(self) -> float | None:
        if self.chunks < 2 or self.before_last <= 0 or self.first_at is None or self.last_at is None:
            return None
        return (self.last_at - self.first_at) / self.before_last
