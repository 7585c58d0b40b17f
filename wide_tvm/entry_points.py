"""Names of the entry points a compiled library has (pure: the compiler and the runtime-only loader share them)."""

MAIN = "main"  # input_ids [1, T] (+ weights) -> logits for every position, stateless
FORWARD = "batch_forward"  # input_ids [1, n], paged KV cache (+ weights) -> logits [1, n, vocab]; generation builds
CREATE_CACHE = "create_kv_cache"  # (max_batch, max_total_tokens, prefill_chunk, page_size, sliding) -> the cache
