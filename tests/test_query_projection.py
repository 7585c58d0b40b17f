"""The gated attention's query projection: found by the label run (passes/query_projection.py), lowered to gemm_mn
only where each query head group feeds its own output group, and the compiled model still matches PyTorch."""

from __future__ import annotations

import contextlib
import io
import re

import numpy as np
import pytest
import torch
from torch import nn
from tvm import relax
from tvm.relax.dpl import rewrite_call

import wide_tvm
from wide_tvm.frontends.export import export_model
from wide_tvm.frontends.loader import import_model
from wide_tvm.model import WideConfig, build_example, example_inputs
from wide_tvm.passes.lower_gated import _channels_of, _is_attention
from wide_tvm.passes.mask_analysis import MaskInfo, analyse_mask
from wide_tvm.passes.patterns import gated_projection
from wide_tvm.passes.query_projection import FREE, MIXED, _merge, _reduce, find_query_projection


def _export(model, cfg, path):
    with contextlib.redirect_stdout(io.StringIO()):
        export_model(model, example_inputs(cfg, 5), path)
    return path


def _query_weights(path) -> list:
    """For each gated attention of the model at `path`: the weight its query projection reads (its Relax
    expression as text), or None where find_query_projection finds none."""
    func = import_model(path).mod["main"]
    v2v = relax.analysis.get_var2val(func)
    pat, found = gated_projection(), []

    def callback(expr, m):
        info = analyse_mask(m[pat.mask], m[pat.operand], _channels_of(m[pat.weight], v2v), v2v)
        if isinstance(info, MaskInfo) and _is_attention(m[pat.operand], v2v):
            q = find_query_projection(func, m[pat.operand], info, v2v)
            weight = None if q is None else v2v[q].args[1]
            found.append(None if weight is None else str(v2v.get(weight, weight)))
        return expr

    rewrite_call(pat.root, callback, func)
    return found


CONFIGS = {
    "gqa": WideConfig(num_layers=1),
    "mha": WideConfig(num_layers=1, num_kv_heads=4),  # K and V have Q's shape: only the label run tells them apart
    "qk_norm": WideConfig(num_layers=1, qk_norm=True),
    "group_4_mqa": WideConfig(num_layers=1, num_kv_heads=1, attn_group_size=4),
    "group_1": WideConfig(num_layers=1, attn_group_size=1),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
def test_finds_the_query_projection(tmp_path, name, fmt):
    cfg = CONFIGS[name]
    found = _query_weights(_export(build_example(cfg), cfg, str(tmp_path / f"m.{fmt}")))
    assert len(found) == 1 and found[0] is not None
    if fmt == "pt2":  # torch.export keeps parameter names
        assert "q_proj" in found[0] and "k_proj" not in found[0] and "v_proj" not in found[0]


class _HeadShuffle(nn.Module):
    """q_proj followed by a head reordering, `within` each attention group or rolling whole groups."""

    def __init__(self, proj: nn.Linear, cfg: WideConfig, within: bool):
        super().__init__()
        self.proj, self.cfg, self.within = proj, cfg, within

    def forward(self, x):
        c = self.cfg
        q = self.proj(x).view(*x.shape[:-1], c.attn_groups, c.attn_group_size, c.head_dim)
        if self.within:  # head i of a group -> head i + 1 of the same group
            q = torch.cat([q[..., 1:, :], q[..., :1, :]], dim=-2)
        else:  # group g -> group g + 1
            q = torch.cat([q[..., 1:, :, :], q[..., :1, :, :]], dim=-3)
        return q.reshape(*x.shape[:-1], -1)


@pytest.mark.parametrize("within", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_head_reordering_decides_and_results_match(tmp_path, within):
    """Query heads reordered inside their groups still feed only their own group: lowered. Groups rolled feed
    another group's output: not lowered (a skipped group would zero heads another group reads). Either way the
    compiled model matches PyTorch."""
    cfg = WideConfig(num_layers=1)
    model = build_example(cfg, seed=4)
    attn = model.layers[0].self_attn
    attn.q_proj = _HeadShuffle(attn.q_proj, cfg, within)
    path = _export(model, cfg, str(tmp_path / "m.pt2"))
    assert (_query_weights(path)[0] is not None) == within
    compiled = wide_tvm.compile(path, "llvm")
    layer = next(layer for layer in compiled.layers if layer.kind == "attention")
    assert any(k.startswith("wide_gemm_mn_g") for k in layer.kernels) == within
    runner = wide_tvm.load(compiled.export(str(tmp_path / "m.so")))
    for t in (1, 6, 17):
        x = example_inputs(cfg, t, seed=t)
        with torch.no_grad():
            ref = model(x).numpy()
        assert np.abs(runner(x.numpy()) - ref).max() / np.abs(ref).max() < 1e-5


class _QueryAlsoElsewhere(nn.Module):
    """q_proj whose output also reaches the layer's output past the gating (a forward hook adds it to the
    attention's result): zeroing its skipped groups would change that output, so q must stay dense."""

    def __init__(self, proj: nn.Linear):
        super().__init__()
        self.proj, self.last = proj, None

    def forward(self, x):
        self.last = self.proj(x)
        return self.last


def test_query_used_past_the_gating_stays_dense(tmp_path):
    cfg = WideConfig(num_layers=1)
    model = build_example(cfg, seed=5)
    attn = model.layers[0].self_attn
    attn.q_proj = _QueryAlsoElsewhere(attn.q_proj)
    attn.register_forward_hook(lambda mod, _args, out: out + 0.5 * mod.q_proj.last)  # q_proj's width is hidden's
    path = _export(model, cfg, str(tmp_path / "m.pt2"))
    assert _query_weights(path) == [None]
    compiled = wide_tvm.compile(path, "llvm")
    layer = next(layer for layer in compiled.layers if layer.kind == "attention")
    assert not any(k.startswith("wide_gemm_mn_g") for k in layer.kernels)
    runner = wide_tvm.load(compiled.export(str(tmp_path / "m.so")))
    x = example_inputs(cfg, 9, seed=9)
    with torch.no_grad():
        ref = model(x).numpy()
    assert np.abs(runner(x.numpy()) - ref).max() / np.abs(ref).max() < 1e-5


@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
def test_kernels_run_one_row_per_token(tmp_path, fmt):
    """Every gated kernel of a lowered model (gate/up, down, q, o) and its mask reorder run over the model's
    token count: the gated attention output [1, T, G, gs] is read as [T, G * gs], not [G * T, gs] rows (which
    once made o_proj's gemm_k run G times the rows, reading past its operand's end)."""
    from wide_tvm.passes import LowerGatedLayers

    cfg = WideConfig(num_layers=1)
    mod = import_model(_export(build_example(cfg), cfg, str(tmp_path / f"m.{fmt}"))).mod
    tokens = str(mod["main"].params[0].ty.shape.values[-1])  # input_ids [1, T]
    lowered = LowerGatedLayers("llvm")(mod)
    calls = []
    relax.analysis.post_order_visit(lowered["main"].body, lambda e: calls.append(e) if isinstance(
        e, relax.Call) and getattr(e.op, "name", "") == "relax.call_tir" else None)
    rows = {c.args[0].name_hint: str(c.args[1].fields[0].ty.shape.values[0]) for c in calls  # x, a or the mask
            if c.args[0].name_hint.startswith("wide_")}
    assert {re.sub(r"_g\d+.*", "", name) for name in rows} == {"wide_gemm_mn_swiglu", "wide_gemm_k", "wide_gemm_mn",
                                                      "wide_mask_reorder"}
    assert set(rows.values()) == {tokens}, rows


def test_label_merges():
    a = np.array([FREE, 3, 3, 3])
    b = np.array([2, FREE, 3, 4])
    np.testing.assert_array_equal(_merge(a, b), [2, 3, 3, MIXED])
    x = np.array([[1, 1, FREE], [1, 2, FREE]])
    np.testing.assert_array_equal(_reduce(x, [1], False), [1, MIXED])
    np.testing.assert_array_equal(_reduce(x, [0], True), [[1, MIXED, FREE]])


def test_wide_tune_plans_the_query_projection_as_its_own_kernel(tmp_path):
    """wide-tune reads the lowering's plan (no kernel built): a model with a gated query projection tunes a plain
    gemm_mn under its own key, next to gate/up's gemm_mn_swiglu (the kernel list was once parsed back from kernel
    names, which filed every wide_gemm_mn_* under gemm_mn_swiglu)."""
    from wide_tvm.kernel_spec import KernelSpec
    from wide_tvm.tuning.driver import model_kernels

    cfg = WideConfig(num_layers=1)
    path = _export(build_example(cfg), cfg, str(tmp_path / "m.onnx"))
    hd, hidden = cfg.head_dim, cfg.hidden_size
    groups = cfg.num_heads // cfg.attn_group_size
    inter = cfg.intermediate_size
    specs = model_kernels(path, "llvm")
    assert specs == sorted([
        KernelSpec("gemm_mn", groups, cfg.attn_group_size * hd, hidden, "float32", "nk"),
        KernelSpec("gemm_k", groups, cfg.attn_group_size * hd, hidden, "float32", "kp"),
        KernelSpec("gemm_mn_swiglu", inter // cfg.ffn_group_size, cfg.ffn_group_size, hidden, "float32", "nk"),
        KernelSpec("gemm_k", inter // cfg.ffn_group_size, cfg.ffn_group_size, hidden, "float32", "kp"),
    ], key=lambda s: (s.key, s.layout))
    assert len({s.key for s in specs}) == 4  # four tuning keys: the query projection is not filed under gate/up
