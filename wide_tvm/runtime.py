"""Load and run a compiled WIDE library with the TVM runtime alone (no TVM compiler needed).

Works in TVM's runtime-only mode (`TVM_USE_RUNTIME_LIB=1`, no libtvm_compiler.so); for CUDA it loads
`libtvm_runtime_cuda.so` itself, since the runtime-only package does not register the CUDA loader.
"""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from .artifact import file_sha256, load_weights, read_meta, weights_path
from .cpu_threads import use_physical_cores
from .blas.libraries import load as load_blas
from .errors import WideError, check_id_range


def ensure_cuda_runtime(tvm) -> None:
    """Load TVM's CUDA runtime library where the runtime-only package has not registered it; WideError where no
    CUDA GPU is visible."""
    if tvm.cuda(0).exist:
        return
    lib = os.path.join(os.path.dirname(tvm.__file__), "lib", "libtvm_runtime_cuda.so")
    if os.path.exists(lib):
        try:
            ctypes.CDLL(lib, ctypes.RTLD_GLOBAL)
        except OSError as err:
            raise WideError(f"cannot load TVM's CUDA runtime ({lib}): {err}") from None
    if not tvm.cuda(0).exist:
        raise WideError("device 'cuda' requested but no CUDA GPU is visible to the TVM runtime")


class WideModel:
    """Callable compiled model: `model(input_ids)` -> logits, NumPy in / NumPy out (torch in / torch out).

    Safe to share between threads: each thread runs its own virtual machine over the one loaded library and the
    one copy of the weights (a TVM VM keeps per-call state and is not reentrant). Inputs are checked against what
    the library was compiled for (rank, fixed dimensions, integer dtype, token ids inside the vocabulary) and a
    call that does not fit is a WideError; int32 ids are widened to the int64 the library takes."""

    def __init__(self, path: str, device: str = "cpu", tokenizer=None):
        if device not in ("cpu", "cuda"):
            raise WideError(f"unknown device {device!r}; use cpu or cuda")
        self.path = path
        for p in (path, weights_path(path)):
            if not os.path.exists(p):
                raise WideError(f"{p}: file not found (a compiled model is NAME.so plus NAME.weights.npz)")
        meta = read_meta(weights_path(path))
        if file_sha256(path) != meta["library_sha256"]:  # checked before the library is opened (it is code)
            raise WideError(f"{path}: does not match {weights_path(path)} (its content hash differs from the one "
                            "wide-compile recorded): another build, or a changed file; not loaded")
        weights, self.meta = load_weights(weights_path(path))
        use_physical_cores()  # before TVM's CPU thread pool starts
        import tvm
        from tvm.runtime import vm as rvm

        if self.meta["device"] != device:
            raise WideError(f"{path} was compiled for {self.meta['device']}, not for device {device!r}")
        if device == "cuda":
            ensure_cuda_runtime(tvm)
        self.device = tvm.cuda(0) if device == "cuda" else tvm.cpu(0)
        load_blas(self.meta.get("blas", []))  # the vendor BLAS the library links (blas/libraries.py)
        try:
            lib = tvm.runtime.load_module(path)
        except Exception as err:  # noqa: BLE001
            raise WideError(f"{path}: cannot load library: {str(err).strip().splitlines()[-1]}") from None
        self._tvm = tvm
        self._lib, self._vm_class, self._local = lib, rvm.VirtualMachine, threading.local()
        self.weights = [tvm.runtime.tensor(w, self.device) for w in weights]
        if isinstance(tokenizer, (str, os.PathLike)):
            from .tokenizer import Tokenizer

            tokenizer = Tokenizer(str(tokenizer))
        self.tokenizer = tokenizer
        self._engine, self._engine_lock = None, threading.Lock()

    def engine(self, **options):
        """This model's generation engine (wide_tvm/engine.py), made on first use; `options` (max_batch,
        max_total_tokens, prefill_chunk) only before that."""
        with self._engine_lock:
            if self._engine is None:
                from .engine import Engine

                self._engine = Engine(self, tokenizer=self.tokenizer, **options)
            elif options:
                raise WideError("the engine already exists: pass its options on the first call")
            return self._engine

    def generate(self, prompts, max_new_tokens: int = 32, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, stop=(), seed: int | None = None, stream: bool = False, **more):
        """Engine.generate on this model's engine: `prompts` token-id lists or strings (with a tokenizer); one
        Generation (.token_ids, .text, .finish_reason) per prompt, or an iterator of Events with `stream=True`."""
        return self.engine().generate(prompts, max_new_tokens, temperature, top_p, top_k, stop, seed, stream, **more)

    @property
    def vm(self):
        """This thread's virtual machine over the shared library."""
        vm = getattr(self._local, "vm", None)
        if vm is None:
            vm = self._local.vm = self._vm_class(self._lib, self.device)
        return vm

    @property
    def input_names(self) -> list[str]:
        return self.meta["input_names"]

    def __call__(self, *inputs):
        """The model's first output (the logits)."""
        return self.outputs(*inputs)[0]

    def outputs(self, *inputs) -> list:
        """Every output of the model, in order (e.g. logits and router masks of a LogitsAndMasks export)."""
        if len(inputs) != len(self.input_names):
            raise WideError(f"model takes {len(self.input_names)} input(s) {self.input_names}, got {len(inputs)}")
        is_torch = type(inputs[0]).__module__.startswith("torch")
        specs = self.meta.get("inputs") or [None] * len(inputs)  # (libraries compiled before 2026-12-07: none)
        args = []
        for x, spec in zip(inputs, specs):
            x = _checked(x, spec, is_torch)
            if is_torch:
                x = x.contiguous()
                args.append(self._tvm.runtime.from_dlpack(x) if x.device.type == self.meta["device"]
                            else self._tvm.runtime.tensor(x.cpu().numpy(), self.device))
            else:
                args.append(self._tvm.runtime.tensor(np.ascontiguousarray(x), self.device))
        out = self.vm["main"](*args, *self.weights)
        outs = list(out) if isinstance(out, (list, tuple)) or type(out).__name__ == "Array" else [out]
        if is_torch:
            import torch

            return [torch.from_dlpack(o) for o in outs]
        return [o.numpy() for o in outs]


def _checked(x, spec: dict | None, is_torch: bool):
    """`x` as the library takes input `spec` (compiler.Compiled.meta: name, dtype, shape, index_bound), widened from
    a narrower integer dtype; WideError where it does not fit."""
    if spec is None:
        return x
    name, want = spec["name"], spec["dtype"]
    dtype = str(x.dtype).replace("torch.", "") if is_torch else np.asarray(x).dtype.name
    shape = tuple(x.shape)
    if len(shape) != len(spec["shape"]) or any(w is not None and w != s for w, s in zip(spec["shape"], shape)):
        dims = ", ".join("T" if d is None else str(d) for d in spec["shape"])
        raise WideError(f"{name}: shape {list(shape)}, the model takes [{dims}]")
    if any(s == 0 for s in shape):
        raise WideError(f"{name}: shape {list(shape)} holds no tokens")
    if want.startswith("int"):
        if not dtype.startswith(("int", "uint")):
            raise WideError(f"{name}: dtype {dtype}; the model takes integers ({want})")
        x = x.to(getattr(__import__("torch"), want)) if is_torch else np.asarray(x).astype(want, copy=False)
        bound = spec.get("index_bound")
        if bound is not None:
            check_id_range(int(x.min()), int(x.max()), bound, name)
    elif dtype != want:
        raise WideError(f"{name}: dtype {dtype}; the model takes {want}")
    return x


def load(path: str, device: str = "cpu", tokenizer=None) -> WideModel:
    """Load NAME.so (+ NAME.weights.npz) for `device` ("cpu" or "cuda"); `tokenizer`: a Hugging Face model folder
    (its tokenizer.json and chat template) for text prompts."""
    return WideModel(path, device, tokenizer)
