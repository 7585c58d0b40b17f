"""Token sampling on the device, from TVM's own sampling operators (`tvm.relax.frontend.nn.op`): the functions a
generation build adds beside its prefill and decode, so a step's logits never leave the device.

    sample_greedy(logits [1, m, vocab]) -> ids [m] int32
        the argmax of each row (temperature 0).
    sample(logits [1, m, vocab], temperature [m] f32, top_p [m] f32, top_k [m] int32, uniform [m] f32) -> ids [m]
        row i: softmax(logits_i / temperature_i), cut to the smallest set of most likely tokens whose probability
        reaches top_p_i, and to top_k_i tokens, renormalised; the token whose cumulative probability first exceeds
        uniform_i (TVM's sample_top_p_top_k_from_sorted_prob). A row of temperature 0 is its argmax.

The uniform numbers come from the caller (the engine draws them from each request's own seeded generator), so the
same seed gives the same tokens. Worked example: logits [[2, 1, 0]] at temperature 1 are the probabilities
[0.665, 0.245, 0.090]; top_p 0.5 keeps token 0 alone (its 0.665 reaches 0.5), so any uniform gives 0; top_p 0.9
keeps tokens 0 and 1, renormalised to [0.731, 0.269]: uniform 0.5 gives 0, uniform 0.8 gives 1.
"""

from __future__ import annotations

import tvm

from ..entry_points import SAMPLE, SAMPLE_GREEDY


def sampling_functions(vocab: int, dtype: str) -> tvm.IRModule:
    """IRModule of SAMPLE_GREEDY and SAMPLE for logits [1, m, vocab] of `dtype` (computed in float32)."""
    from tvm import relax
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn import op

    def rows(logits):  # [1, m, vocab] -> [m, vocab] float32
        return op.astype(op.reshape(logits, [logits.shape[1], vocab]), "float32")

    def argmax(x):  # [m, vocab] -> [m] int32
        return op.wrap_nested(relax.op.astype(relax.op.argmax(x._expr, axis=-1), "int32"), "argmax")

    class Sampler(nn.Module):
        def sample_greedy(self, logits: nn.Tensor):
            return argmax(rows(logits))

        def sample(self, logits: nn.Tensor, temperature: nn.Tensor, top_p: nn.Tensor, top_k: nn.Tensor,
                   uniform: nn.Tensor):
            x = rows(logits)
            m = x.shape[0]
            column = (lambda t: op.reshape(t, [m, 1]))
            hot = op.maximum(temperature, op.full([m], 1e-6, "float32"))  # (greedy rows: any positive value)
            prob = op.softmax(op.divide(x, column(hot)), axis=-1)
            order = op.argsort(prob, axis=-1, descending=True, dtype="int32")
            ranked = op.sort(prob, axis=-1, descending=True)
            picked = op.sample_top_p_top_k_from_sorted_prob(
                ranked, order, column(top_p), column(top_k), column(uniform),
                op.reshape(op.arange(0, m, dtype="int64"), [m, 1]))
            greedy = op.less_equal(temperature, op.zeros([m], "float32"))
            return op.where(greedy, argmax(x), op.reshape(picked, [m]))

    logits = nn.spec.Tensor([1, "m", vocab], dtype)
    vec = (lambda dt: nn.spec.Tensor(["m"], dt))
    none = {"param_mode": "none", "effect_mode": "none"}
    spec = {SAMPLE_GREEDY: {"logits": logits, "$": none},
            SAMPLE: {"logits": logits, "temperature": vec("float32"), "top_p": vec("float32"),
                     "top_k": vec("int32"), "uniform": vec("float32"), "$": none}}
    mod, _ = Sampler().export_tvm(spec=spec)
    return mod
