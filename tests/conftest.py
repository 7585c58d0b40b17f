"""Shared fixtures: tiny WIDE models exported once per session, and a kernel build helper."""

from __future__ import annotations

import os
import tempfile

import pytest

# the tests never read or write the developer's own tunings (tuning/folders.py: user_root), only the shipped ones
os.environ["WIDE_TVM_TUNING_HOME"] = tempfile.mkdtemp(prefix="wide-tunings-")

if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n N: the workers fill the cores already; a TVM pool of every
    os.environ.setdefault("TVM_NUM_THREADS", "1")  # core in each of them only contends (set before wide_tvm is)

from wide_tvm.cuda_aot import cuda_codegen  # noqa: E402

cuda_codegen()  # before tvm is imported anywhere, so CUDA build tests embed real device code

import tvm  # noqa: E402

from wide_tvm.frontends.export import export_model  # noqa: E402
from wide_tvm.targets import parse_target  # noqa: E402
from wide_tvm.model import WideConfig, build_example, example_inputs  # noqa: E402


def build_cpu(func):
    """func compiled as wide-compile compiles for this machine's CPU (targets.parse_target: AVX where it has it)."""
    return tvm.compile(func.with_attr("global_symbol", "main"), target=parse_target("llvm"))["main"]


def module_sources(executable) -> str:
    """The source of every module an executable carries (LLVM IR of the host code, CUDA C of the kernels)."""
    modules, todo = [], [executable.mod]
    while todo:
        modules.append(todo.pop())
        todo += list(modules[-1].imports)
    return "".join(m.inspect_source() for m in modules if m.kind in ("llvm", "cuda"))


def greedy_tokens(model, prompt: list[int], new: int) -> list[int]:
    """PyTorch's greedy continuation of `prompt` (a model returning logits, or an output with .logits), the whole
    sequence recomputed each step: the reference generation tests compare against."""
    import torch

    seq, out = list(prompt), []
    with torch.no_grad():
        for _ in range(new):
            logits = model(torch.tensor([seq]))
            logits = logits.logits if hasattr(logits, "logits") else logits
            out.append(int(logits[0, -1].argmax()))
            seq.append(out[-1])
    return out


def assert_matches_model(runner, model, cfg, tokens=(1, 7, 33), tol: float = 1e-5) -> None:
    """A loaded library equals the PyTorch model (float32) at each token count, relative to the logits' largest
    magnitude, and gives the same bits on a second call."""
    import numpy as np
    import torch

    for t in tokens:
        x = example_inputs(cfg, t, seed=t)
        with torch.no_grad():
            ref = model(x).numpy()
        out = runner(x.numpy())
        assert np.abs(out - ref).max() / np.abs(ref).max() < tol, t
        assert np.array_equal(out, runner(x.numpy())), t


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """Callable (cfg_name, fmt) -> (path, model, cfg), exported once per session."""
    cache = {}
    configs = {
        "default": WideConfig(),
        "groups_1_16": WideConfig(attn_group_size=1, ffn_group_size=16, num_layers=1),
        "partial": WideConfig(num_layers=2, gated_layers=[1], ffn_group_size=64),
        "dense": WideConfig(num_layers=1, gated_layers=[]),
    }
    root = tmp_path_factory.mktemp("models")

    def get(name: str, fmt: str):
        key = (name, fmt)
        if key not in cache:
            cfg = configs[name]
            model = build_example(cfg, seed=3)
            path = str(root / f"{name}.{fmt}")
            export_model(model, example_inputs(cfg, 6), path)
            cache[key] = (path, model, cfg)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def generation_library(exported, tmp_path_factory):
    """(library path, PyTorch model, cfg, tokenizer folder): the default example compiled once with
    generation=True for the CPU, and a word-level tokenizer of its vocabulary."""
    import wide_tvm
    from wide_tvm.tiny_checkpoint import write_tiny_tokenizer

    path, model, cfg = exported("default", "onnx")
    root = tmp_path_factory.mktemp("generation")
    compiled = wide_tvm.compile(path, "llvm", generation=True, max_batch=8)
    lib = compiled.export(str(root / "m.so"))
    return lib, model, cfg, write_tiny_tokenizer(str(root / "tokenizer"), cfg.vocab_size)
