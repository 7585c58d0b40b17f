"""Gates recognised by what they compute, however a model spells them (passes/mask_analysis.py), and routers whose
gates are not recognised reported by name (passes/gate_report.py), on WIDE-style models written independently of
wide_tvm.model (tests/wide_style_model.py), through ONNX and .pt2."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import wide_tvm
from wide_tvm.compiler import UnloweredGateWarning
from wide_tvm.frontends.export import export_model
from wide_tvm.frontends.loader import import_model
from wide_tvm.passes import LowerGatedLayers
from wide_tvm.targets import parse_target

from wide_style_model import LayerSpelling, StyleModel

L = LayerSpelling
# Each model's layers spell the gate in different ways; every spelling of the issue is in one of them
MODELS = {
    # WIDE's own inference path: argmax -> bool -> logical_not, einops apply_mask, repeat_interleave head mask, SDPA
    "wide": [L("logical_not", "einops", "sdpa_gqa"), L("logical_not", "einops", "softmax")],
    "argmax": [L("eq0", "repeat_interleave", "sdpa_causal"), L("ne1", "expand", "sdpa_mask", "einops"),
               L("one_minus", "tile", "softmax", "expand"), L("where", "einops", "sdpa_gqa")],
    "compare": [L("compare", "expand", "softmax", "einops"), L("softmax", "repeat_interleave", "sdpa_gqa", "expand")],
}
FORMATS = ["onnx", "pt2"]


@pytest.fixture(scope="module")
def style_exports(tmp_path_factory):
    root, cache = tmp_path_factory.mktemp("style"), {}

    def get(name: str, fmt: str, spellings: list | None = None):
        if (name, fmt) not in cache:
            model = StyleModel(spellings or MODELS[name], seed=1)
            path = str(root / f"{name}.{fmt}")
            export_model(model, torch.randint(0, 64, (1, 5)), path)
            cache[name, fmt] = (path, model)
        return cache[name, fmt]

    return get


def _plan(path: str) -> LowerGatedLayers:
    lower = LowerGatedLayers("llvm", build=False)
    with parse_target("llvm"):
        lower(import_model(path).mod)
    return lower


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", list(MODELS))
def test_every_spelling_is_lowered(style_exports, name, fmt):
    """Each layer's FFN and attention gates are lowered (counted), whatever the spelling, and nothing is reported."""
    path, _ = style_exports(name, fmt)
    plan = _plan(path).plan
    kinds = sorted(layer.kind for layer in plan.layers)
    assert kinds == sorted(["ffn", "attention"] * len(MODELS[name])), (kinds, [str(g) for g in plan.unlowered])
    assert plan.unlowered == []
    assert {(layer.groups, layer.group_size) for layer in plan.layers} == {(6, 32), (2, 32)}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", ["wide", pytest.param("argmax", marks=pytest.mark.slow),
                                  pytest.param("compare", marks=pytest.mark.slow)])
def test_spellings_match_pytorch(style_exports, tmp_path, name, fmt):
    """The compiled model (gates lowered) gives PyTorch's logits for one token, an odd count and more."""
    path, model = style_exports(name, fmt)
    lib = str(tmp_path / "m.so")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnloweredGateWarning)
        compiled = wide_tvm.compile(path, "llvm")
    assert len(compiled.layers) == 2 * len(MODELS[name])
    compiled.export(lib)
    runner = wide_tvm.load(lib)
    gen = torch.Generator().manual_seed(7)
    for t in (1, 7, 33):
        ids = torch.randint(0, 64, (1, t), generator=gen)
        with torch.no_grad():
            ref = model(ids).numpy()
        np.testing.assert_allclose(runner(ids.numpy()), ref, rtol=2e-4, atol=2e-4)


UNRECOGNISED = [L("plus_one", "repeat_interleave", "softmax"), L("eq0", "interleaved", "softmax")]


@pytest.mark.parametrize("fmt", FORMATS)
def test_unrecognised_gates_are_reported_per_router(style_exports, fmt):
    """A gate that is not 0 / 1 (argmax + 1) and one spread over interleaved channels are not lowered (either would
    compute something else); each router is named with the node where recognition stopped; the rest still lowers."""
    path, _ = style_exports("unrecognised", fmt, UNRECOGNISED)
    plan = _plan(path).plan
    assert sorted(layer.kind for layer in plan.layers) == ["attention"]  # layer 1's attention gate (eq0)
    gates = {g.router.replace("p_", "").replace("_", "."): g for g in plan.unlowered}
    assert sorted(gates) == ["layers.0.router.attention.router", "layers.0.router.ffn.router",
                             "layers.1.router.ffn.router"], [str(g) for g in plan.unlowered]
    assert all("takes the values [1, 2], not 0 and 1" in gates[k].reason for k in list(gates)[:2])
    assert "relax.add" in gates["layers.0.router.ffn.router"].node
    interleaved = gates["layers.1.router.ffn.router"]
    assert "contiguous runs of 32 channels" in interleaved.reason and interleaved.groups == 6
    with pytest.raises(wide_tvm.WideError, match="3 router gate\\(s\\) not lowered \\(strict\\)"):
        wide_tvm.compile(path, "llvm", strict=True)


def test_wide_compile_reports_and_strict_fails(style_exports, tmp_path, capsys):
    """wide-compile: an unrecognised gate is one warning line per router (the library still builds, dense there);
    --strict makes it exit 2 with the routers named and writes nothing."""
    from wide_tvm.cli import compile_main

    path, _ = style_exports("unrecognised", "pt2", UNRECOGNISED)
    out = tmp_path / "m.so"
    assert compile_main([path, "-o", str(out), "--strict"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "router_ffn_router (6 groups): gate not lowered" in err and not out.exists()
    assert compile_main([path, "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("gate not lowered") == 3 and out.exists()
    assert "router gates not recognised (their layers run dense): 3" in captured.out


@pytest.mark.parametrize("fmt", ["pt2", pytest.param("onnx", marks=pytest.mark.slow)])  # (CI time: one format)
def test_wide_export_writes_sdpa_attention(tmp_path, fmt):
    """wide-export --attention sdpa writes each layer's attention as one scaled_dot_product_attention; it compiles
    with the same gated kernels as the written-out attention (query projection included) and PyTorch's logits."""
    from wide_tvm.cli import export_main
    from wide_tvm.model import WideConfig, build_example

    paths = {kind: str(tmp_path / f"{kind}.{fmt}") for kind in ("eager", "sdpa")}
    for kind, path in paths.items():
        assert export_main(["-o", path, "--attention", kind]) == 0
    kernels = {kind: [layer.kernels for layer in _plan(path).plan.layers] for kind, path in paths.items()}
    assert kernels["sdpa"] == kernels["eager"] and any("wide_gemm_mn_g" in k for ks in kernels["sdpa"] for k in ks)
    lib = str(tmp_path / "m.so")
    wide_tvm.compile(paths["sdpa"], "llvm").export(lib)
    runner = wide_tvm.load(lib)
    model = build_example(WideConfig(attention="sdpa"), seed=0)
    for t in (1, 6):
        ids = torch.randint(0, model.config.vocab_size, (1, t), generator=torch.Generator().manual_seed(t))
        with torch.no_grad():
            ref = model(ids).numpy()
        np.testing.assert_allclose(runner(ids.numpy()), ref, rtol=2e-4, atol=2e-4)
