"""The end-to-end benchmark's model, compiled without its 16 GB of weights ever existing here.

`E2E_MODELS["llama8b"]` is Llama-3.1-8B's shapes (32 layers, hidden 4096, 32 query / 8 KV heads of 128,
intermediate 14336, vocabulary 128256) with WIDE routers on every layer (attention groups of 4 heads, FFN groups of
128 channels, router rank 128), fp16. `import_for_benchmark(cfg)` exports one decoder layer's module called
`cfg.num_layers` times (torch.export lifts the shared weights once: every layer reads the last name's), imports
it with its weights as zero-stride placeholders of their shapes (no copies), then gives each use of a shared weight
its own parameter (`untie`), named after the layer it belongs to: the module is the model of `num_layers` distinct
layers, as exported whole. compile() keeps the placeholders through the repacking, and the library
(`Compiled.export_library`) runs on weights the benchmark makes on the GPU from a seed.

Worked example, 2 layers: the tied main(input_ids, embed, p_layers_1_q, ..., lm_head) reads p_layers_1_q in both
layers; untied, main(input_ids, embed, p_layers_0_q, p_layers_1_q, ..., lm_head), one per layer.
"""

from __future__ import annotations

from dataclasses import replace

from ..model.config import LLAMA_3_1_8B, WideConfig

E2E_MODELS = {
    "llama8b": LLAMA_3_1_8B,
    # Llama-3.2-1B's shapes (16 layers, hidden 2048, 32 query / 8 KV heads of 64): the CPU's end-to-end model
    "llama1b": WideConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
                          num_kv_heads=8, head_dim=64, attn_group_size=4, ffn_group_size=128, router_rank=128,
                          rope_theta=500000.0, attention="sdpa"),
    "tiny": WideConfig(num_layers=2, attention="sdpa"),  # (the CPU test of the benchmark's whole flow)
}


def tied_program(cfg: WideConfig, dtype: str = "float16"):
    """torch.export of the model of `cfg` whose layers are one module called `cfg.num_layers` times."""
    import torch

    from ..frontends.export import export_program
    from ..model import build_example, example_inputs

    model = build_example(replace(cfg, num_layers=1), seed=0)
    model.layers = torch.nn.ModuleList([model.layers[0]] * cfg.num_layers)
    model = model.to(getattr(torch, dtype)).eval()
    with torch.no_grad():
        return export_program(model, example_inputs(cfg, 8))


def untie(imported):
    """`imported` (frontends.loader.ImportedModel, placeholder weights) with each weight read by k bindings split into
    k parameters, the i-th named for layer i (`layers_<n>_` in its name), and weights read by none dropped."""
    import re

    import tvm
    from tvm import relax

    from ..frontends.loader import ImportedModel

    func = imported.mod["main"]
    n_in = len(imported.input_names)
    weights = list(func.params[n_in:])
    arrays = dict(zip(weights, imported.weights))
    copies: dict = {w: [] for w in weights}

    def use(w):  # the k-th reader of w: layer k's own parameter
        k = len(copies[w])
        if re.search(r"layers_\d+_", w.name):
            copies[w].append(relax.Var(re.sub(r"layers_\d+_", f"layers_{k}_", w.name, count=1), w.ty))
        else:
            copies[w].append(relax.Var(f"{w.name}_{k}", w.ty) if k else w)
        return copies[w][-1]

    @relax.expr_functor.mutator
    class Untie(relax.PyExprMutator):
        current: dict = {}

        def visit_var_binding_(self, binding):
            self.current = {w: use(w) for w in relax.analysis.free_vars(binding.value) if w in copies}
            super().visit_var_binding_(binding)
            self.current = {}

        def visit_var_(self, var):
            return self.current.get(var, var)

    body = Untie().visit_expr(func.body)
    layered = [i for i, w in enumerate(weights) if re.search(r"layers_\d+_", w.name)]
    first = layered[0] if layered else len(weights)

    def order(item):  # layer by layer, as the whole model's export orders them
        i, k, _ = item
        return (k + 1 if i in layered else 0 if i < first else len(weights) + 1, i)

    kept = sorted(((i, k, c) for i, w in enumerate(weights) for k, c in enumerate(copies[w])), key=order)
    params = [*func.params[:n_in], *(c for _, _, c in kept)]
    mod = tvm.IRModule(dict(imported.mod.functions))
    mod["main"] = relax.Function(params, body, func.ret_ty, func.is_pure, func.attrs)
    return ImportedModel(mod, [arrays[weights[i]] for i, _, _ in kept], [c.name for _, _, c in kept],
                         imported.input_names, imported.source)


def import_for_benchmark(cfg: WideConfig, dtype: str = "float16"):
    """The Relax import (frontends.loader.ImportedModel) of `cfg`'s model, untied, its weights placeholders."""
    from ..frontends.loader import import_model

    tied = import_model(tied_program(cfg, dtype), f"<{cfg.num_layers}-layer benchmark model>", weights=False)
    return untie(tied)
