"""GPU memory from physics: the KV pool SGLang allocates, and the memory that pool does not hold.

SGLang preallocates its KV pool at start (`model_runner.profile_max_num_token`): once the weights are
loaded, everything above `(1 − mem_fraction_static)` of the card becomes KV cells of
`2 × layers × kv_heads × head_dim × dtype_bytes` each. What stays outside — the headroom — holds the CUDA
graphs and every forward pass's activations: the LLM's live tensors per prefill token, the vision /
audio encoder over the images of the request being encoded, the encoder outputs waiting to be
scattered into the prompt, and fp32 logits per sampled sequence. A step whose activations outgrow the
headroom is a CUDA out-of-memory error, whatever the pool's fill.

Memory *in use* (the seed table's "memory peak") counts the pool's cells that hold tokens, not the
whole reservation: context + weights + CUDA graphs + used KV + the step's activations.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from loadtest.sim.profile import PrefillChunk, Profile

GIB = 1 << 30
MIB = 1 << 20


def sglang_mem_fraction_static(gpu_mib: float, prefill_chunk: int, cuda_graph_max_bs: int) -> float:
    """SGLang 0.5.9's default (`ServerArgs._handle_gpu_memory_settings`, one GPU, no speculative decoding):
    reserve 512 MB + 1.5 MB per token of the largest prefill step (the chunked-prefill size, else
    max_prefill_tokens) + 2 MB per CUDA-graph batch size + 128 MB for parallelism, at least 10 GiB on
    cards over 60 GiB, and give the rest to weights and KV pool."""
    reserved = 512 + max(prefill_chunk, 2048) * 1.5 + cuda_graph_max_bs * 2 + 1024 / 8
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


@dataclass(frozen=True, slots=True)
class MemoryModel:
    """One engine's memory budget in bytes; built by `memory_model` from a profile and the engine's flags."""

    gpu_bytes: int
    context_bytes: int
    weight_bytes: int
    kv_bytes_per_token: int
    pool_tokens: int
    graph_bytes: int
    mem_fraction_static: float
    prefill_token_bytes: int
    encoder_token_bytes: int
    embedding_token_bytes: int
    logits_bytes_per_seq: int

    @property
    def static_bytes(self) -> int:
        """Always in use: CUDA context, weights and the captured CUDA graphs."""
        return self.context_bytes + self.weight_bytes + self.graph_bytes

    @property
    def headroom_bytes(self) -> int:
        """What a forward pass may allocate: the card minus static memory and the whole KV reservation."""
        return self.gpu_bytes - self.static_bytes - self.pool_tokens * self.kv_bytes_per_token

    def in_use(self, kv_tokens: int, activation_bytes: int) -> int:
        return self.static_bytes + kv_tokens * self.kv_bytes_per_token + activation_bytes

    def prefill_bytes(self, chunks: Iterable[PrefillChunk], sampled: int) -> int:
        """Activation peak of one prefill step: the LLM's live tensors for every token computed, the
        encoder over the largest request being encoded (SGLang encodes request by request), every
        encoded request's output embeddings (held until the step scatters them) and one fp32 logits row
        per sequence that samples its first token."""
        tokens = encoder_max = encoder_sum = 0
        for c in chunks:
            tokens += c.extend
            encoder_sum += c.encoder_tokens
            encoder_max = max(encoder_max, c.encoder_tokens)
        return (
            self.prefill_token_bytes * tokens
            + self.encoder_token_bytes * encoder_max
            + self.embedding_token_bytes * encoder_sum
            + self.logits_bytes_per_seq * sampled
        )

    def decode_bytes(self, batch: int) -> int:
        """Activation peak of one decode step: one token's live tensors and one logits row per sequence."""
        return (self.prefill_token_bytes + self.logits_bytes_per_seq) * batch


def memory_model(
    profile: Profile,
    *,
    prefill_chunk: int,
    max_running_requests: int,
    mem_fraction_static: float | None = None,
    max_total_tokens: int | None = None,
) -> MemoryModel:
    """The pool SGLang would allocate on the profile's GPU (or `max_total_tokens` when smaller, as
    SGLang's `--max-total-tokens` caps it) and the activation coefficients, in bytes."""
    hw, m = profile.memory, profile.model
    gpu = int(hw.gpu_memory_gib * GIB)
    context = int(hw.cuda_context_gib * GIB)
    weights = int(sum(m.params_b.values()) * 1e9 * m.dtype_bytes)
    kv_cell = 2 * m.layers * m.kv_heads * m.head_dim * m.dtype_bytes
    fraction = mem_fraction_static or hw.mem_fraction_static
    if fraction is None:
        fraction = sglang_mem_fraction_static(gpu / MIB, prefill_chunk, hw.cuda_graph_max_bs)
    # profile_max_num_token: free memory after the weights, minus (1 − f) of what was free before them
    rest = (gpu - context - weights) - (gpu - context) * (1 - fraction)
    if rest <= 0:
        raise ValueError(
            f"mem_fraction_static {fraction} leaves no KV pool: the weights need "
            f"{weights / GIB:.1f} GiB of the {hw.gpu_memory_gib} GiB card"
        )
    pool = int(rest) // kv_cell
    if max_total_tokens is not None:
        pool = min(pool, max_total_tokens)
    a = hw.activations
    return MemoryModel(
        gpu_bytes=gpu,
        context_bytes=context,
        weight_bytes=weights,
        kv_bytes_per_token=kv_cell,
        pool_tokens=pool,
        graph_bytes=hw.cuda_graph_bytes_per_bs * min(hw.cuda_graph_max_bs, max_running_requests),
        mem_fraction_static=fraction,
        prefill_token_bytes=a.prefill_token_bytes,
        encoder_token_bytes=a.encoder_token_bytes,
        embedding_token_bytes=a.embedding_token_bytes,
        logits_bytes_per_seq=a.logits_bytes_per_seq,
    )
