"""Minimal pure-PyTorch stand-in for the ``sgl_kernel`` CPU extension.

The real ``sgl_kernel`` / ``sglang-kernel`` wheel published on PyPI is built
for CUDA only; its CPU build has to be compiled from source.  For a dense
Llama-style model served with ``--device cpu --attention-backend torch_native``
SGLang 0.5.23 imports exactly one symbol from it on the CPU path:

    sglang/srt/mem_cache/allocation.py:
        if _is_cpu:
            from sgl_kernel import assign_req_to_token_pool_cpu

and sglang/kernels/ops/kvcache/cache_move.py:
        if _is_cpu:
            from sgl_kernel import copy_all_layer_kv_cache_cpu

and, at import time only, seven speculative-decoding (EAGLE) kernels from
sglang/kernels/ops/speculative/{spec_tree,cache_locs,eagle,multi_layer_eagle}.py,
which are imported unconditionally on CPU by modules the scheduler loads.

The two memory-pool kernels are implemented here with plain tensor indexing.
The speculative ones are placeholders that raise NotImplementedError when
called: speculative decoding is NOT supported with this shim. It is slow-but-correct
and only meant for functional tests.
Any other ``from sgl_kernel import X`` fails loudly with ImportError, so a code
path that needs a real kernel is not silently faked.
"""

import ctypes

import torch

__version__ = "0.0.0+cpu-shim"


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Same contract as the Triton kernel ``assign_req_to_token_pool``.

    For request i (in batch order):
        req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]] =
            out_cache_loc[sum_{j<i}(end_offset[j]-start_offset[j]) : ... + len_i]
    ``pool_len`` (= req_to_token.shape[1]) is accepted for signature parity.
    """
    del pool_len
    idx = req_pool_indices.tolist()
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    pt = 0
    for r, s, e in zip(idx, starts, ends, strict=False):
        n = e - s
        if n <= 0:
            continue
        req_to_token[r, s:e] = out_cache_loc[pt : pt + n].to(req_to_token.dtype)
        pt += n


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """Same contract as the Triton kernel ``copy_all_layer_kv_cache_tiled``.

    ``data_ptrs[b]`` is the base address of KV buffer b (one per layer and K/V),
    ``strides[b]`` its row size in bytes.  For every buffer, row ``src_loc[j]``
    is copied to row ``tgt_loc[j]``.  All source rows are read before any
    target row is written, so overlapping (in-place) moves are safe.
    """
    if tgt_loc.numel() == 0:
        return
    tgt = tgt_loc.to(torch.int64)
    src = src_loc.to(torch.int64)
    n_rows = int(torch.maximum(tgt.max(), src.max()).item()) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=False):
        nbytes = n_rows * stride
        buf = (ctypes.c_uint8 * nbytes).from_address(ptr)
        rows = torch.frombuffer(buf, dtype=torch.uint8).view(n_rows, stride)
        rows[tgt] = rows[src]  # advanced indexing gathers a copy first


def _unsupported(name):
    def _fn(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not available in the CPU shim "
            "(speculative decoding needs the real sgl-kernel CPU build)"
        )

    _fn.__name__ = name
    return _fn


# Imported at module level by sglang.kernels.ops.speculative.* when
# SGLANG_USE_CPU_ENGINE=1; never called unless speculative decoding is enabled.
build_tree_kernel_efficient_cpu = _unsupported("build_tree_kernel_efficient_cpu")
verify_tree_greedy_cpu = _unsupported("verify_tree_greedy_cpu")
assign_draft_cache_locs_contiguous_cpu = _unsupported("assign_draft_cache_locs_contiguous_cpu")
assign_extend_cache_locs_cpu = _unsupported("assign_extend_cache_locs_cpu")
fill_accept_out_cache_loc_cpu = _unsupported("fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = _unsupported("fill_bonus_tokens_cpu")
rotate_input_ids_cpu = _unsupported("rotate_input_ids_cpu")
