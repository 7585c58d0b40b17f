"""wide-tvm: compile token-level dynamically pruned (WIDE) LLMs into block-sparse TVM kernels.

`compile` needs the TVM compiler; `load` works with the TVM runtime alone, so neither is imported
until it is used. Importing the package changes nothing in the process: the CPU thread count, the CUDA stand-in
driver and the nvcc callback are installed by `compile` / `load` (and the tools that build kernels) when called.
"""

from .errors import WideError


def compile(model, target: str = "llvm", tuning_log: str | None = None, dense: bool = False,  # noqa: A001
            dependent_launch: bool = True, strict: bool = False, blas: bool = True, fallback: str = "auto",
            generation: bool = False, max_batch: int = 64, cuda_graph: bool | None = None):
    """Compile a .onnx/.pt2 path or an ExportedProgram; returns an object with `.export(path)`. `strict`: a router
    whose gate is not recognised is an error (else a warning, and its layer runs dense). `blas`: dense matmuls go
    to the vendor BLAS (cuBLASLt on CUDA, OpenBLAS on the CPU), else to TVM's own kernels. `fallback` ("auto",
    "off", "always"): gated kernels run the vendor BLAS instead at the token counts where that is faster
    (wide_tvm/fallback.py). `generation`: also the paged-KV-cache entry points a generator needs (`load(...).generate`);
    `max_batch`: the most sequences one decode step takes; `cuda_graph` (default on for CUDA): decode steps in CUDA
    graphs."""
    from .compiler import compile as _compile

    return _compile(model, target, tuning_log, dense, dependent_launch, strict, blas, fallback, generation,
                    max_batch, cuda_graph)


def load(path: str, device: str = "cpu", tokenizer=None):
    """Load a compiled library for "cpu" or "cuda"; returns a callable model, which also generates
    (`.generate(prompts, max_new_tokens, temperature, top_p, top_k, stop, seed, stream)`) where the library was
    compiled with generation=True. `tokenizer`: a Hugging Face model folder, for text prompts and `.text`."""
    from .runtime import load as _load

    return _load(path, device, tokenizer)


__all__ = ["WideError", "compile", "load"]
