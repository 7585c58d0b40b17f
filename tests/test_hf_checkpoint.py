"""WIDE checkpoints on Hugging Face bases: tiny random Llama / Qwen3 folders, synthetic router.pth / lora.pth.

Checks the conversion against transformers itself, the compiled model against the PyTorch model token
by token (logits and every router mask), the CLI path, and every checkpoint error the issue names.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import wide_tvm
from wide_tvm.cli import compile_main, export_main
from wide_tvm.frontends.export import export_model
from wide_tvm.frontends.hf_checkpoint import load_wide_checkpoint
from wide_tvm.model import LogitsAndMasks

from wide_tvm.tiny_checkpoint import (ATTN_GROUPS, FFN_GROUPS, LORA_ALPHA, LORA_R, RANK, SIZES, random_routers,
                                      write_tiny_checkpoint)

LAYERS, VOCAB = SIZES["num_hidden_layers"], SIZES["vocab_size"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """kind -> folder holding the base model, router.pth, router_all.pth and lora.pth."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for seed, kind in enumerate(("llama", "qwen3")):
        folder = write_tiny_checkpoint(str(root / kind), kind, seed)
        torch.save(random_routers(20 + seed, all_execute=True), os.path.join(folder, "router_all.pth"))
        out[kind] = root / kind
    return out


def _hf_reference(folder, lora: dict | None):
    """transformers' own model, with the LoRA merged by hand (W += B @ A * alpha / r)."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32).eval()
    if lora:
        mods = dict(base.named_modules())
        with torch.no_grad():
            for key, a in lora.items():
                if ".lora_A." in key:
                    name = key.removeprefix("base_model.model.").split(".lora_A.")[0]
                    b = lora[key.replace("lora_A", "lora_B")]
                    mods[name].weight += b @ a * (LORA_ALPHA / LORA_R)
    return base


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("with_lora", [False, True])
def test_conversion_matches_transformers(checkpoints, kind, with_lora):
    """All-execute routers: the gated model must equal transformers' forward (RoPE, q/k norm, ties, LoRA)."""
    folder = checkpoints[kind]
    ckpt = load_wide_checkpoint(str(folder), str(folder / "router_all.pth"),
                                str(folder / "lora.pth") if with_lora else None, lora_alpha=LORA_ALPHA)
    assert (ckpt.config.attn_group_size, ckpt.config.ffn_group_size, ckpt.config.router_rank) == (2, 32, RANK)
    assert ckpt.config.qk_norm == (kind == "qwen3")
    ref = _hf_reference(folder, torch.load(folder / "lora.pth") if with_lora else None)
    x = torch.randint(0, VOCAB, (1, 11), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ours, theirs = ckpt.model(x), ref(x).logits
        plain = _hf_reference(folder, None)(x).logits
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-5 * theirs.abs().max().item())
    assert with_lora == (not torch.allclose(plain, theirs, atol=1e-4))  # the LoRA really changed the model


@pytest.mark.parametrize("kind,fmt", [("llama", "onnx"), pytest.param("qwen3", "pt2", marks=pytest.mark.slow)])
def test_compiled_matches_pytorch_with_masks(checkpoints, tmp_path, kind, fmt):
    folder = checkpoints[kind]
    ckpt = load_wide_checkpoint(str(folder), str(folder / "router.pth"), str(folder / "lora.pth"),
                                attn_group_size=2, ffn_group_size=32, rank=RANK, lora_alpha=LORA_ALPHA)
    probe = LogitsAndMasks(ckpt.model).eval()
    path = export_model(probe, torch.zeros(1, 5, dtype=torch.long), str(tmp_path / f"{kind}.{fmt}"))
    compiled = wide_tvm.compile(path, "llvm")
    assert sum(layer.kind == "ffn" for layer in compiled.layers) == LAYERS
    assert sum(layer.kind == "attention" for layer in compiled.layers) == LAYERS
    # the query projection is gated too, through Qwen3's q_norm as through Llama's plain RoPE
    assert all(layer.kernels[-1].startswith("wide_gemm_mn_g") for layer in compiled.layers
               if layer.kind == "attention")
    lib = str(tmp_path / f"{kind}.so")
    runner = wide_tvm.load(compiled.export(lib))
    for t in (1, 7, 19):
        x = torch.randint(0, VOCAB, (1, t), generator=torch.Generator().manual_seed(t))
        with torch.no_grad():
            ref_logits, ref_masks = probe(x)
        logits, masks = runner.outputs(x.numpy())
        assert masks.shape == (1, t, LAYERS * (ATTN_GROUPS + FFN_GROUPS))
        np.testing.assert_array_equal(masks, ref_masks.numpy())  # identical per-token masks
        err = np.abs(logits - ref_logits.numpy()).max() / np.abs(ref_logits.numpy()).max()
        assert err < 1e-5, err
    assert 0.1 < float(masks.mean()) < 0.9  # the random routers really gate


@pytest.mark.slow
def test_cli_export_then_compile(checkpoints, tmp_path, capsys):
    folder = checkpoints["qwen3"]
    onnx_path, lib = str(tmp_path / "qwen3.onnx"), str(tmp_path / "qwen3.so")
    assert export_main(["--hf-model", str(folder), "--routers", str(folder / "router.pth"),
                        "--lora", str(folder / "lora.pth"), "--lora-alpha", str(LORA_ALPHA),
                        "--attn-group-size", "2", "--ffn-group-size", "32", "-o", onnx_path]) == 0
    assert "LoRA merged into 8 modules" in capsys.readouterr().out
    assert compile_main([onnx_path, "--target", "llvm", "-o", lib]) == 0
    ckpt = load_wide_checkpoint(str(folder), str(folder / "router.pth"), str(folder / "lora.pth"),
                                lora_alpha=LORA_ALPHA)
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = ckpt.model(x).numpy()
    out = wide_tvm.load(lib)(x.numpy())
    assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-5


def _edit(sd: dict, drop=(), **replace) -> dict:
    sd = {k: v for k, v in sd.items() if not any(k.startswith(d) for d in drop)}
    sd.update(replace)
    return sd


ROUTER_ERRORS = {
    "extra_layer": (lambda: random_routers(1, layers=LAYERS + 1), [], "routers for layer(s) [2], but the base model has 2"),
    "missing_layer": (lambda: _edit(random_routers(1), drop=["model.layers.1.router_ffn"]), [],
                      "routers missing for 1 sub-layer(s): ['layers.1.router_ffn']"),
    "hidden": (lambda: _edit(random_routers(1), **{"model.layers.0.router_ffn.compressor.weight": torch.zeros(RANK, 32)}),
               [], "reads 32 features, but the base model's hidden size is 64"),
    "heads": (lambda: random_routers(1, groups=(3, FFN_GROUPS)), [], "routes 3 groups, which does not divide"),
    "channels": (lambda: random_routers(1, groups=(ATTN_GROUPS, 5)), [], "does not divide the base model's 192 FFN"),
    "odd_logits": (lambda: _edit(random_routers(1), **{"model.layers.0.router_ffn.router.weight": torch.zeros(5, RANK)}),
                   [], "emits 2 logits (execute, skip) per group"),
    "missing_bias": (lambda: _edit(random_routers(1), drop=["model.layers.0.router_attention.router.bias"]), [],
                     "layers.0.router_attention lacks router.bias"),
    "unknown_key": (lambda: _edit(random_routers(1), **{"model.layers.0.router_attention.gate.weight": torch.zeros(1)}),
                    [], "not WIDE router weights"),
    "group_not_dividing": (lambda: random_routers(1), ["--attn-group-size", "3"], "--attn-group-size 3 does not divide"),
    "group_disagrees": (lambda: random_routers(1), ["--ffn-group-size", "64"], "gives 3 groups of FFN channels"),
    "rank": (lambda: random_routers(1), ["--rank", "4"], "--rank 4, but"),
}


@pytest.mark.parametrize("case", sorted(ROUTER_ERRORS))
def test_router_errors(checkpoints, tmp_path, capsys, case):
    make, extra, message = ROUTER_ERRORS[case]
    routers = tmp_path / "router.pth"
    torch.save(make(), routers)
    out = tmp_path / "m.onnx"
    rc = export_main(["--hf-model", str(checkpoints["llama"]), "--routers", str(routers), *extra, "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and message in err, err
    assert "Traceback" not in err and not out.exists()


LORA_ERRORS = {
    "missing_module": ({"model.layers.0.mlp.fc9.lora_A.weight": torch.zeros(2, 64),
                        "model.layers.0.mlp.fc9.lora_B.weight": torch.zeros(64, 2)}, ["--lora-alpha", "4"],
                       "LoRA for module 'model.layers.0.mlp.fc9', which the base model lacks"),
    "shape": ({"model.layers.0.mlp.up_proj.lora_A.weight": torch.zeros(2, 64),
               "model.layers.0.mlp.up_proj.lora_B.weight": torch.zeros(64, 2)}, ["--lora-alpha", "4"],
              "gives a [64, 64] update to a [192, 64] weight"),
    "unpaired": ({"model.layers.0.mlp.up_proj.lora_A.weight": torch.zeros(2, 64)}, ["--lora-alpha", "4"],
                 "has lora_A but no lora_B"),
    "no_alpha": ({"model.layers.0.mlp.up_proj.lora_A.weight": torch.zeros(2, 64),
                  "model.layers.0.mlp.up_proj.lora_B.weight": torch.zeros(192, 2)}, [], "--lora needs --lora-alpha"),
}


@pytest.mark.parametrize("case", sorted(LORA_ERRORS))
def test_lora_errors(checkpoints, tmp_path, capsys, case):
    sd, extra, message = LORA_ERRORS[case]
    lora = tmp_path / "lora.pth"
    torch.save(sd, lora)
    folder = checkpoints["llama"]
    out = tmp_path / "m.onnx"
    rc = export_main(["--hf-model", str(folder), "--routers", str(folder / "router.pth"), "--lora", str(lora),
                      *extra, "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and message in err, err
    assert "Traceback" not in err and not out.exists()


def test_base_model_errors(checkpoints, tmp_path, capsys):
    folder = checkpoints["llama"]
    routers = str(folder / "router.pth")
    cases = [(["--hf-model", str(tmp_path / "nope"), "--routers", routers], "model folder not found"),
             (["--hf-model", str(tmp_path), "--routers", routers], "no config.json"),
             (["--hf-model", str(folder), "--routers", str(tmp_path / "r.pth")], "router checkpoint file not found"),
             (["--hf-model", str(folder)], "--hf-model and --routers go together")]
    (tmp_path / "bad.pth").write_bytes(b"not a checkpoint")
    cases.append((["--hf-model", str(folder), "--routers", str(tmp_path / "bad.pth")], "cannot read router checkpoint"))
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text('{"model_type": "gpt2"}')
    cases.append((["--hf-model", str(gpt2), "--routers", routers], "model_type 'gpt2' is not supported"))
    for argv, message in cases:
        assert export_main([*argv, "-o", str(tmp_path / "m.onnx")]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)
    assert not os.path.exists(tmp_path / "m.onnx")
