"""The exported-graph constructs TVM 0.27's importers trip over, each in a small model of its own."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import wide_tvm
from wide_tvm.frontends.export import export_model
from wide_tvm.model.modules import causal_mask, repeat_kv, rope_cos_sin


class RopePositions(torch.nn.Module):
    """Range(0.0, Cast(float, tokens), 1.0): positions broadcast against [1, T, D] activations."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(32, 8)

    def forward(self, input_ids):
        x = self.embed(input_ids)
        cos, sin = rope_cos_sin(input_ids.shape[1], 8, 10000.0, x)
        return x * cos + x * sin


class CausalMaskExpand(torch.nn.Module):
    """torch.full(-inf).triu(1) causal mask and repeat_kv's expand over a symbolic token dimension."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(32, 8)

    def forward(self, input_ids):
        x = self.embed(input_ids)  # [1, T, 8]
        kv = x.view(1, x.shape[1], 2, 4).transpose(1, 2)  # [1, 2, T, 4]
        k = repeat_kv(kv, 2)  # [1, 4, T, 4]
        scores = torch.matmul(k, k.transpose(2, 3)) + causal_mask(x.shape[1], x)
        return torch.softmax(scores, dim=-1)


class Sdpa(torch.nn.Module):
    """torch's scaled_dot_product_attention as Hugging Face models call it (its ONNX export: a scalar Unsqueeze axis,
    which TVM's importer could not take): GQA heads through `enable_gqa` or repeated, causal or an explicit mask."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.embed = torch.nn.Embedding(32, 16)

    def forward(self, input_ids):
        x = self.embed(input_ids)  # [1, T, 16]
        t = x.shape[1]
        q = x.view(1, t, 4, 4).transpose(1, 2)  # 4 query heads
        kv = x[..., :8].view(1, t, 2, 4).transpose(1, 2)  # 2 key / value heads
        if self.kind == "gqa":
            return F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        kv = kv.repeat_interleave(2, dim=1)
        if self.kind == "causal":
            return F.scaled_dot_product_attention(q, kv, kv, is_causal=True)
        return F.scaled_dot_product_attention(q, kv, kv, attn_mask=causal_mask(t, x))  # an explicit additive mask


class SdpaGqa(Sdpa):
    def __init__(self):
        super().__init__("gqa")


class SdpaCausal(Sdpa):
    def __init__(self):
        super().__init__("causal")


class SdpaMask(Sdpa):
    def __init__(self):
        super().__init__("mask")


@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
@pytest.mark.parametrize("module", [RopePositions, CausalMaskExpand, SdpaGqa, SdpaCausal, SdpaMask])
def test_construct_imports_and_runs(tmp_path, fmt, module):
    torch.manual_seed(0)
    model = module().eval()
    path = str(tmp_path / f"m.{fmt}")
    export_model(model, torch.randint(0, 32, (1, 5)), path)
    lib = str(tmp_path / "m.so")
    wide_tvm.compile(path, "llvm").export(lib)
    runner = wide_tvm.load(lib)
    for t in (1, 6, 17):
        x = torch.randint(0, 32, (1, t))
        with torch.no_grad():
            ref = model(x).numpy()
        np.testing.assert_allclose(runner(x.numpy()), ref, rtol=1e-5, atol=1e-6)


def test_weights_stay_parameters(exported):
    from wide_tvm.frontends.loader import import_model

    path, model, _ = exported("default", "pt2")
    imported = import_model(path)
    n_params = sum(1 for _ in model.parameters())
    assert len(imported.weights) == n_params
    assert not imported.mod["main"].attrs or "params" not in imported.mod["main"].attrs


def test_kernel_spec_docstring_examples():
    """The worked examples in wide_tvm/kernel_spec.py's docstring hold (the pure-Python kernel description)."""
    import doctest

    from wide_tvm import kernel_spec

    assert doctest.testmod(kernel_spec).failed == 0
