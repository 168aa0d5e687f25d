"""Memory from physics: SGLang's pool sizing, and what the pool does not hold, on exact arithmetic."""

from __future__ import annotations

import pytest

from loadtest.sim.config import SimConfig
from loadtest.sim.engine import Engine, EngineConfig, SimRequest
from loadtest.sim.memory import GIB, MIB, MemoryModel, memory_model, sglang_mem_fraction_static
from loadtest.sim.profile import PrefillChunk, load_profile
from tests.sim.test_engine import COSTS


def test_sglang_rule_for_mem_fraction_static() -> None:
    # ServerArgs._handle_gpu_memory_settings: 512 + 1.5 × chunk + 2 × graph batch sizes + 1024 / 8 MB
    # A100-80G (79.25 GiB as CUDA reports), chunk 8192, 256 graphs: 13440 MB reserved
    assert sglang_mem_fraction_static(79.25 * 1024, 8192, 256) == round((81152 - 13440) / 81152, 3) == 0.834
    # A100-40G defaults (chunk 4096, 32 graphs): 6848 MB reserved, no 10 GiB floor below 60 GiB
    assert sglang_mem_fraction_static(40960, 4096, 32) == round((40960 - 6848) / 40960, 3) == 0.833
    # a small chunk still reserves for 2048 tokens; cards over 60 GiB keep at least 10 GiB
    assert sglang_mem_fraction_static(65536, 512, 8) == round((65536 - 10240) / 65536, 3)


def test_pool_is_what_sglang_allocates_after_the_weights() -> None:
    profile = load_profile("default")
    m = memory_model(profile, prefill_chunk=8192, max_running_requests=128)
    weights = 8.94e9 * 2  # language 7.62 + vision 0.68 + audio 0.64 billion, bf16
    assert m.weight_bytes == int(weights) and m.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2 == 57_344
    assert m.mem_fraction_static == 0.834
    free = 79.25 * GIB - 0.5 * GIB  # what CUDA leaves PyTorch before the weights
    rest = free - weights - free * (1 - 0.834)  # model_runner.profile_max_num_token
    assert m.pool_tokens == int(rest) // 57_344 == 917_980
    assert m.graph_bytes == 128 * 2 * MIB  # captured up to the cap, 2 MB each
    assert m.headroom_bytes == int(79.25 * GIB) - m.static_bytes - 917_980 * 57_344
    assert m.static_bytes == int(0.5 * GIB) + m.weight_bytes + m.graph_bytes
    # --max-total-tokens caps the pool (SGLang takes the smaller); the rest stays outside it
    small = memory_model(profile, prefill_chunk=8192, max_running_requests=8, max_total_tokens=180_000)
    assert small.pool_tokens == 180_000 and small.graph_bytes == 8 * 2 * MIB
    assert small.headroom_bytes - m.headroom_bytes == (917_980 - 180_000) * 57_344 + (128 - 8) * 2 * MIB
    # an explicit --mem-fraction-static replaces the rule
    roomy = memory_model(profile, prefill_chunk=8192, max_running_requests=8, mem_fraction_static=0.9)
    assert roomy.pool_tokens == int(free - weights - free * (1 - 0.9)) // 57_344
    with pytest.raises(ValueError, match="leaves no KV pool"):
        memory_model(profile, prefill_chunk=8192, max_running_requests=8, mem_fraction_static=0.2)


def test_sim_config_sizes_the_engine_from_memory() -> None:
    profile = load_profile("default")
    config, memory = SimConfig(max_running_requests=64).build(profile)
    assert config.max_total_tokens == memory.pool_tokens == 917_980
    config, memory = SimConfig(max_total_tokens=50_000).build(profile)
    assert config.max_total_tokens == memory.pool_tokens == 50_000


def test_prefill_activation_counts_tokens_the_largest_encode_held_embeddings_and_logits() -> None:
    m = _model(headroom=10**9, prefill=3, encoder=100, embedding=7, logits=1000)
    chunks = [PrefillChunk(0, 400, 300), PrefillChunk(0, 200, 150), PrefillChunk(50, 100, 0)]
    # 3 × 700 tokens + 100 × the largest encode (300) + 7 × every encoded token (450) + 1000 × 2 sampled
    assert m.prefill_bytes(chunks, sampled=2) == 3 * 700 + 100 * 300 + 7 * 450 + 1000 * 2
    assert m.decode_bytes(5) == (3 + 1000) * 5


def _model(
    headroom: int, prefill: int = 1, encoder: int = 10, embedding: int = 0, logits: int = 0
) -> MemoryModel:
    """A card of 10 000 + headroom bytes, 1 byte per KV cell, a 10 000-token pool, nothing else static."""
    return MemoryModel(
        gpu_bytes=10_000 + headroom,
        context_bytes=0,
        weight_bytes=0,
        kv_bytes_per_token=1,
        pool_tokens=10_000,
        graph_bytes=0,
        mem_fraction_static=0.5,
        prefill_token_bytes=prefill,
        encoder_token_bytes=encoder,
        embedding_token_bytes=embedding,
        logits_bytes_per_seq=logits,
    )


def _engine(oom_mode: str, headroom: int = 1000) -> Engine:
    cfg = EngineConfig(max_total_tokens=10_000, max_running_requests=8, oom_mode=oom_mode)  # type: ignore[arg-type]
    return Engine(cfg, COSTS, memory=_model(headroom))


def _images(rid: str, prompt: int, encoder: int) -> SimRequest:
    return SimRequest(rid, prompt, 10, 10, encoder_tokens=encoder)


def test_a_prefill_batch_over_the_headroom_crashes_the_engine() -> None:
    e = _engine("crash")
    a, b = _images("a", 300, 50), _images("b", 300, 0)  # together: 600 + 10 × 50 = 1100 > 1000
    e.submit(a)
    e.submit(b)
    r = e.step()
    assert r is not None and r.kind == "crash" and set(r.failed) == {a, b} and e.total_crashes == 1
    assert a.error is not None and a.error.status == 500
    assert a.error.message.startswith("CUDA out of memory. Tried to allocate")


def test_retract_mode_stops_the_batch_before_the_headroom_and_fails_what_alone_cannot_fit() -> None:
    e = _engine("retract")
    a, b, c = _images("a", 300, 50), _images("b", 300, 0), _images("c", 100, 100)  # c alone: 1100
    for x in (a, b, c):
        e.submit(x)
    first = e.step()
    assert first is not None and first.emitted == [a] and first.activation_bytes == 800
    second = e.step()  # b fits on its own, b with c does not: c waits for the next batch
    assert second is not None and second.emitted == [b] and not second.failed and e.waiting == [c]
    third = e.step()  # c alone does not fit either: it fails, in no time, and the engine lives on
    assert third is not None and third.failed == [c] and third.end == third.start == second.end
    assert c.error is not None and c.error.status == 500 and c.finish_reason == "error"
    fourth = e.step()
    assert fourth is not None and fourth.kind == "decode" and e.total_crashes == 0
    assert e.running == [a, b] and e.waiting == []


def test_memory_in_use_is_static_plus_cached_tokens_plus_the_steps_activations() -> None:
    m = _model(headroom=10**6, prefill=2, encoder=3)
    e = Engine(EngineConfig(max_total_tokens=10_000, max_running_requests=8), COSTS, memory=m)
    e.submit(_images("a", 300, 50))
    r = e.step()
    assert r is not None and r.activation_bytes == 2 * 300 + 3 * 50
    assert e.memory_in_use == m.static_bytes + 300 + 750
    d = e.step()  # decode: 301 cached tokens (the first sampled one joins the cache), 2 bytes per sequence
    assert d is not None and d.kind == "decode" and e.memory_in_use == 301 + 2
    assert e.memory_peak(window_s=1.0) == 1050  # both steps ended within the last virtual second
    assert e.memory_peak(window_s=0.005) == 303
