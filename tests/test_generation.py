"""Generation over TVM's paged KV cache (issue 55): the compiler's mapping of a model's attention onto the cache
(passes/kv_cache_attention.py), and greedy generation through it (wide_tvm/engine.py) against PyTorch, on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import wide_tvm
from conftest import greedy_tokens
from wide_tvm.engine import Engine
from wide_tvm.errors import WideError


def _incremental(hf_model, prompt: list[int], new: int) -> list[int]:
    """transformers' greedy continuation on its own KV cache: the prompt once, then one token a step."""
    with torch.no_grad():
        out = hf_model(torch.tensor([prompt]), use_cache=True)
        tokens = [int(out.logits[0, -1].argmax())]
        for _ in range(new - 1):
            out = hf_model(torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values, use_cache=True)
            tokens.append(int(out.logits[0, -1].argmax()))
    return tokens


@pytest.fixture(scope="module")
def engine(generation_library):
    lib, model, cfg, _ = generation_library
    loaded = wide_tvm.load(lib)
    shape = loaded.meta["kv_cache"]
    assert shape["layers"] == cfg.num_layers and shape["kv_heads"] == cfg.num_kv_heads
    assert loaded.meta["generation"] == {"max_batch": 8, "vocab": cfg.vocab_size, "cuda_graph": False}
    return Engine(loaded, max_batch=4, max_total_tokens=512), model, cfg


def test_greedy_generation_is_token_identical_to_pytorch(engine):
    """A batch of prompts of different lengths (one of a single token), 32 new tokens each, prefilled as one ragged
    batch and decoded together: every token equals PyTorch's greedy choice; each prompt alone gives the same."""
    eng, model, cfg = engine
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in (1, 6, 13)]
    results = eng.generate(prompts, max_new_tokens=32)
    for prompt, result in zip(prompts, results):
        assert result.token_ids == greedy_tokens(model, prompt, 32) and result.finish_reason == "length"
    assert [eng.generate([p], max_new_tokens=32)[0].token_ids for p in prompts] == [r.token_ids for r in results]


def test_generation_stops_and_checks_its_inputs(engine):
    eng, model, cfg = engine
    prompt = [3, 1, 4, 1, 5]
    first = greedy_tokens(model, prompt, 3)
    stopped = eng.generate([prompt], max_new_tokens=10, stop_token_ids=[first[2]])[0]
    assert stopped.token_ids == first[:3] and stopped.finish_reason == "stop"
    for bad, what in (([], "non-empty"), ([[]], "non-empty"), ([[1, cfg.vocab_size]], "outside"), ([[-1]], "outside"),
                      ([[0.5]], "integer"), ([[10**12]], "outside"), ([[True]], "integer"), ("text", "list"),
                      ([["a"]], "integer"), ([[1]], "max_new_tokens")):
        with pytest.raises(WideError, match=what):
            eng.generate(bad, max_new_tokens=0 if what == "max_new_tokens" else 2)
    with pytest.raises(WideError, match="needs a tokenizer"):
        eng.generate(["some text"], max_new_tokens=2)
    with pytest.raises(WideError, match=r"need 608 tokens of cache; it holds 512"):
        eng.generate([[1] * 600], max_new_tokens=2)
    assert eng.stats()["reserved_pages"] == 0


def test_a_library_without_the_cache_says_how_to_build_one():
    """What a library compiled without generation=True records (compiler.Compiled.meta: kv_cache None)."""
    from types import SimpleNamespace

    with pytest.raises(WideError, match="generation=True"):
        Engine(SimpleNamespace(meta={"kv_cache": None, "inputs": [{"index_bound": 256}]}))
    with pytest.raises(WideError, match="again"):  # (a library of the first generation builds: no decode)
        Engine(SimpleNamespace(meta={"kv_cache": {"layers": 2}, "inputs": [{"index_bound": 256}]}))


def test_attention_that_does_not_fit_the_cache_names_its_node():
    """An attention without a causal mask (an encoder's) cannot decode token by token: one error naming it."""
    import tvm
    from tvm import relax

    from wide_tvm.passes.kv_cache_attention import add_generation_functions

    s = tvm.tirx.Var("s", "int64")
    bb = relax.BlockBuilder()
    ids = relax.Var("input_ids", relax.TensorType([1, s], "int64"))
    q = relax.Var("q", relax.TensorType([1, 2, s, 8], "float32"))
    with bb.function("main", [ids, q]):
        with bb.dataflow():
            scores = bb.emit(relax.op.divide(relax.op.matmul(q, relax.op.permute_dims(q, [0, 1, 3, 2])),
                                              relax.const(2.0, "float32")))
            probs = bb.emit(relax.op.nn.softmax(scores, axis=-1))
            out = bb.emit_output(relax.op.matmul(probs, q))
        bb.emit_func_output(out)
    with pytest.raises(WideError, match=r"attention at \w+ = relax.nn.softmax .*no causal mask"):
        add_generation_functions(bb.get(), 4)


def test_wide_generate_streams_the_same_tokens(engine, capsys):
    from wide_tvm.cli import generate_main

    eng, model, _ = engine
    lib = eng.model.path
    assert generate_main([lib, "--ids", "5,7,9", "--max-new-tokens", "6"]) == 0
    assert capsys.readouterr().out.split() == [str(t) for t in greedy_tokens(model, [5, 7, 9], 6)]
    assert generate_main([lib, "--ids", "5,7,9", "--ids", "1", "--max-new-tokens", "4"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split() for ln in lines] == [[str(t) for t in greedy_tokens(model, p, 4)] for p in ([5, 7, 9], [1])]
    assert generate_main([lib, "--ids", "5,99999"]) == 2
    assert "outside" in capsys.readouterr().err


def test_wide_generate_takes_text_with_a_tokenizer(generation_library, capsys):
    from wide_tvm.cli import generate_main
    from wide_tvm.tokenizer import Tokenizer

    lib, model, _, folder = generation_library
    tok = Tokenizer(folder)
    ids = tok.encode("bab bad")
    assert generate_main([lib, "--tokenizer", folder, "--prompt", "bab bad", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.split() == tok.decode(greedy_tokens(model, ids, 5)).split()
    assert generate_main([lib, "--prompt", "bab"]) == 2
    assert "needs a tokenizer" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("fmt,fallback", [("pt2", "auto"), ("onnx", "always")])
def test_generation_from_every_format_and_on_the_dense_fallbacks(exported, tmp_path, fmt, fallback):
    """Also `wide-compile --generation` (the CLI path of the build)."""
    from wide_tvm.cli import compile_main

    path, model, cfg = exported("default", fmt)
    lib = str(tmp_path / "m.so")
    assert compile_main([path, "--generation", "--fallback", fallback, "-o", lib]) == 0
    eng = Engine(wide_tvm.load(lib))
    prompts = [[9, 8, 7, 6], [cfg.vocab_size - 1]]
    assert [r.token_ids for r in eng.generate(prompts, max_new_tokens=20)] == [greedy_tokens(model, p, 20) for p in prompts]


@pytest.mark.slow
def test_generation_from_an_sdpa_export(tmp_path):
    """torch.export writes scaled_dot_product_attention as its math decomposition (q and k each scaled by
    sqrt(scale), a `where` after the softmax for fully masked rows): it maps onto the cache as well."""
    from wide_tvm.frontends.export import export_model
    from wide_tvm.model import WideConfig, build_example, example_inputs

    cfg = WideConfig(attention="sdpa")
    model = build_example(cfg, seed=3).eval()
    path = str(tmp_path / "sdpa.pt2")
    export_model(model, example_inputs(cfg, 6), path)
    eng = Engine(wide_tvm.load(wide_tvm.compile(path, "llvm", generation=True).export(str(tmp_path / "m.so"))))
    prompts = [[4, 2], [7] * 9]
    assert [r.token_ids for r in eng.generate(prompts, max_new_tokens=24)] == [greedy_tokens(model, p, 24) for p in prompts]


def test_a_half_precision_sdpa_export_caches_half_precision(tmp_path):
    """torch.export's SDPA decomposition of an fp16 model computes attention in fp32 (q, k, v cast up): the cache
    holds the fp16 tensors from before the cast (half the bytes), and generation still follows PyTorch's."""
    from wide_tvm.frontends.export import export_program
    from wide_tvm.frontends.loader import import_model
    from wide_tvm.model import WideConfig, build_example, example_inputs

    cfg = WideConfig(attention="sdpa")
    model = build_example(cfg, seed=3).half().eval()
    with torch.no_grad():
        imported = import_model(export_program(model, example_inputs(cfg, 6)))
    compiled = wide_tvm.compile(imported, "llvm", generation=True)
    assert compiled.kv_cache.dtype == "float16"
    eng = Engine(wide_tvm.load(compiled.export(str(tmp_path / "m.so"))), max_batch=2, max_total_tokens=256)
    prompts = [[4, 2, 9], [7] * 5]
    assert [r.token_ids for r in eng.generate(prompts, max_new_tokens=12)] == [greedy_tokens(model, p, 12)
                                                                                for p in prompts]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_hf_checkpoint_generation_equals_transformers_incremental_decoding(tmp_path, kind):
    """A tiny Hugging Face checkpoint (Qwen3: q/k norm before RoPE) with routers that execute every group: greedy
    generation equals transformers' model decoding incrementally on its own KV cache (`generate` itself would differ
    where its min_new_tokens suppresses the checkpoint's EOS id); with random routers and a LoRA, it equals the
    gated PyTorch model."""
    import os

    from transformers import AutoModelForCausalLM

    from wide_tvm.frontends.export import export_model
    from wide_tvm.frontends.hf_checkpoint import load_wide_checkpoint
    from wide_tvm.tiny_checkpoint import LORA_ALPHA, RANK, random_routers, write_tiny_checkpoint

    folder = write_tiny_checkpoint(str(tmp_path / kind), kind, 0)
    torch.save(random_routers(20, all_execute=True), os.path.join(folder, "router_all.pth"))
    prompts = [[5, 3, 9, 1, 2, 8], [11]]
    hf = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32).eval()
    variants = [("router_all.pth", None)] + ([("router.pth", "lora.pth")] if kind == "qwen3" else [])
    for routers, lora in variants:  # (the gated + LoRA variant on the slow Qwen3 run only: CI time)
        ckpt = load_wide_checkpoint(folder, os.path.join(folder, routers),
                                    os.path.join(folder, lora) if lora else None, lora_alpha=LORA_ALPHA,
                                    attn_group_size=2, ffn_group_size=32, rank=RANK)
        path = export_model(ckpt.model.eval(), torch.zeros(1, 5, dtype=torch.long), str(tmp_path / f"{kind}.onnx"))
        lib = wide_tvm.compile(path, "llvm", generation=True).export(str(tmp_path / f"{kind}_{routers}.so"))
        got = [r.token_ids for r in Engine(wide_tvm.load(lib)).generate(prompts, max_new_tokens=32)]
        if lora is None:
            want = [_incremental(hf, p, 32) for p in prompts]
        else:
            want = [greedy_tokens(ckpt.model.eval(), p, 32) for p in prompts]
        assert got == want, (routers, got, want)
