"""The paged KV cache's creation function and TIR kernels, from TVM's own `TIRPagedKVCache`, and the pass that adds
them with the prefill, decode and sampling functions (AddGeneration).

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
from ..entry_points import CREATE_CACHE, DECODE
from .kv_cache_attention import CacheShape, add_generation_functions

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


@tvm.transform.module_pass(opt_level=0, name="AddGeneration")
class AddGeneration:
    """The entry points a generator needs, added to a module with the stateless `main`: `prefill` and `decode`
    (add_generation_functions; decode batches of at most `max_batch`, captured in CUDA graphs where `cuda_graph`),
    the cache's creation function and kernels, and the samplers (passes/sampling.py). `self.cache` is the
    CacheShape after it ran. Runs after the gated lowering, so prefill and decode call the same gated kernels as
    `main`."""

    def __init__(self, target: tvm.target.Target, max_batch: int, cuda_graph: bool = False):
        self.target, self.max_batch, self.cuda_graph = target, max_batch, cuda_graph
        self.cache: CacheShape | None = None
        self.vocab: int | None = None

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        from .sampling import sampling_functions

        mod, self.cache = add_generation_functions(mod, self.max_batch, cuda_graph=self.cuda_graph)
        logits = mod[DECODE].ret_ty
        while not hasattr(logits, "shape") and getattr(logits, "fields", None):  # (a tuple of the logits)
            logits = logits.fields[0]
        self.vocab = int(logits.shape.values[-1])
        created = cache_functions(self.cache, self.target)
        created.update(sampling_functions(self.vocab, str(logits.dtype)))
        clash = sorted({gv.name_hint for gv in mod.functions} & {gv.name_hint for gv in created.functions})
        if clash:
            raise WideError(f"the generation functions {clash} clash with the model's")
        mod.update(created)
        return mod
