"""The paged KV cache's creation function and TIR kernels, from TVM's own `TIRPagedKVCache`, and the pass that adds
them with `batch_forward` (AddBatchForward).

`cache_functions(shape, target)` is an IRModule holding `create_kv_cache(max_batch_size, max_total_seq_len,
prefill_chunk_size, page_size, support_sliding_window)` (each an R.Shape of one value; the VM builtin
`vm.builtin.paged_attention_kv_cache_create` builds the cache object) and the prefill / decode / append kernels it
registers with the cache, for `target` (CUDA, or llvm: TVM ships CPU forms of every kernel). The cache applies no
RoPE (RopeMode.NONE): the graph rotates q and k itself (passes/kv_cache_attention.py).

Worked example: Llama-3.1-8B (32 layers, 32 query / 8 KV heads of 128, fp16) pages of 16 tokens: one page holds
2 (K and V) x 8 x 16 x 128 x 2 bytes = 64 KiB per layer.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

from ..errors import WideError
from ..entry_points import CREATE_CACHE
from .kv_cache_attention import CacheShape, add_batch_forward

CREATE_ARGS = ("max_batch_size", "max_total_seq_len", "prefill_chunk_size", "page_size", "support_sliding_window")


def cache_functions(shape: CacheShape, target: tvm.target.Target) -> tvm.IRModule:
    """IRModule of CREATE_CACHE and the cache's kernels for `shape` on `target`."""
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn.llm.kv_cache import RopeMode, TIRPagedKVCache

    class Factory(nn.Module):
        def create_kv_cache(self, max_batch_size: tirx.Var, max_total_seq_len: tirx.Var,
                            prefill_chunk_size: tirx.Var, page_size: tirx.Var, support_sliding_window: tirx.Var):
            return TIRPagedKVCache(
                attn_kind="mha", max_batch_size=max_batch_size, max_total_seq_len=max_total_seq_len,
                prefill_chunk_size=prefill_chunk_size, page_size=page_size,
                support_sliding_window=support_sliding_window, layer_partition=relax.ShapeExpr([0, shape.layers]),
                num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                qk_head_dim=shape.head_dim, v_head_dim=shape.head_dim, mla_original_qk_head_dim=0,
                mla_original_v_head_dim=0, rope_mode=RopeMode.NONE, rope_scale=1, rope_theta=1, rope_scaling={},
                rope_ext_factors=relax.prim_value(0), rotary_dim=shape.head_dim, enable_disaggregation=False,
                dtype=shape.dtype, target=target)

    spec = {CREATE_CACHE: {**{name: int for name in CREATE_ARGS}, "$": {"param_mode": "none",
                                                                      "effect_mode": "none"}}}
    mod, _ = Factory().export_tvm(spec=spec)
    return mod


@tvm.transform.module_pass(opt_level=0, name="AddBatchForward")
class AddBatchForward:
    """add_batch_forward on the module's `main`, plus the cache's creation function and kernels
    (passes/kv_cache_create.py); `self.cache` is the CacheShape after it ran. Runs after the gated lowering, so
    `batch_forward` calls the same gated kernels as `main`."""

    def __init__(self, target: tvm.target.Target):
        self.target = target
        self.cache: CacheShape | None = None

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mod, self.cache = add_batch_forward(mod)
        taken = {gv.name_hint for gv in mod.functions}
        created = cache_functions(self.cache, self.target)
        clash = sorted(taken & {gv.name_hint for gv in created.functions})
        if clash:
            raise WideError(f"the paged KV cache's functions {clash} clash with the model's")
        mod.update(created)
        return mod
