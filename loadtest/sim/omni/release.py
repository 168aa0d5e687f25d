"""What changes between the sglang-omni versions the simulator plays (the README has the sources).

`snapshot` is the mirrored tree at 2489a10 (2026-04-05); `later` is sglang-omni 0.1.9 (October 2026, the
wheel on the package index: its HTTP surface checked against the real app by tests/omni_real/) and main after
it. Costs per release live in the profile; the behaviours below live in code.
"""

from __future__ import annotations

from dataclasses import dataclass

from loadtest.sim.omni.profile import Release


@dataclass(frozen=True, slots=True)
class Behaviour:
    # OpenAI content parts (image_url, input_audio, …) are parsed; the snapshot json.dumps a list `content`
    # into the prompt text (preprocessing/text.py:normalize_messages).
    content_parts: bool
    # Text-only requests skip talker_ar/code_predictor/code2wav; the snapshot's speech pipeline fans every
    # request out to the talker (thinker_next_speech) and only the HTTP layer drops the audio.
    text_only_skips_audio_stages: bool
    # Bad requests answer 400, a full queue 503 and a duplicate request id 409 (http_status_from_error); the
    # snapshot answers every generation failure with 500.
    error_statuses: bool
    # A streamed request whose client goes away is aborted (Coordinator.stream's finally → abort()); the
    # snapshot never aborts, and no release aborts a non-streamed chat.
    aborts_streams_on_disconnect: bool
    # --max-queued-requests exists (coordinator max_in_flight = thinker cap + queued).
    queue_limit: bool
    # validate_prompt_seq_len: prompt + max_new_tokens (2048 when unset) must fit the context; the snapshot
    # clamps max_new_tokens to the room left instead.
    rejects_long_completion: bool
    # 0.1.9's surface: a streamed chat's failure is an error event carrying its status as `code`, then [DONE];
    # streamed speech is raw PCM (`audio/pcm`, x-sample-rate …) whose usage comes afterwards from
    # GET /v1/audio/speech/{id}, or `speech.audio.delta` / `speech.audio.done` events with stream_format sse;
    # speech errors use OpenAI's envelope; a whole answer is aborted when its client leaves. The snapshot cuts
    # a failed stream, sends `audio.speech.chunk` events and runs a whole answer on.
    in_band_failures: bool


BEHAVIOURS: dict[Release, Behaviour] = {
    "snapshot": Behaviour(False, False, False, False, False, False, False),
    "later": Behaviour(True, True, True, True, True, True, True),
}

DEFAULT_MAX_NEW_TOKENS = 2048  # thinker max_new_tokens when the request sets none (both releases)
