"""Names of the entry points a compiled library has (pure: the compiler and the runtime-only loader share them)."""

MAIN = "main"  # input_ids [1, T] (+ weights) -> logits for every position, stateless
# generation builds (wide-compile --generation; passes/kv_cache_attention.py, passes/sampling.py):
PREFILL = "prefill"  # input_ids [1, n] (ragged batch), logit_positions [m], paged KV cache (+ weights) -> [1, m, vocab]
DECODE = "decode"  # input_ids [1, b] (one token per sequence), paged KV cache (+ weights) -> logits [1, b, vocab]
SAMPLE_GREEDY = "sample_greedy"  # logits [1, m, vocab] -> token ids [m] (argmax)
SAMPLE = "sample"  # logits [1, m, vocab], temperature, top_p [m] f32, top_k [m] i32, uniform [m] f32 -> ids [m]
CREATE_CACHE = "create_kv_cache"  # (max_batch, max_total_tokens, prefill_chunk, page_size, sliding) -> the cache
