"""wide-bench e2e: generation end to end, our engine against dense PyTorch, on Llama-3.1-8B shapes (32 layers, fp16;
wide_tvm/bench/e2e_model.py).

    wide-bench e2e-build DIR [--layers N]     # here: the gated and dense generation libraries (no weights)
    wide-bench e2e DIR --json OUT.json        # on the GPU: every row, each in its own process, then the table

Rows: our engine gated (random routers: about half the groups of each token active), our engine compiled dense
(the same engine and kernels, no gating), PyTorch eager with SDPA and a static KV cache, and torch.compile of the
same (mode "reduce-overhead": decode steps in CUDA graphs, gpt-fast style; wide_tvm/bench/torch_llama.py). Weights
are random, made on the GPU from a seed. Measures, medians:
    ttft_ms[P]        time to first token of one prompt of P tokens (prefill + sampling + the id on the host)
    decode_tok_s[C][B] tokens per second of B sequences decoding together at a context of C tokens (greedy, the
                       new ids on the host every step)
    step_ms[C][B]     the same as the time of one decode step
    memory_gib        GPU memory in use at the end (weights, cache, workspace)
and, measured in the same run, the GPU's copy bandwidth and each library's weight bytes, for the decode step's
fixed cost at batch 1: its time beyond streaming the weights it reads.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

PROMPTS = (128, 512, 2048, 4096)
BATCHES = (1, 4, 16, 64)
CONTEXTS = (512, 4096)
STEPS = 32  # timed decode steps per (context, batch)
ROWS = ("ours_gated", "ours_dense", "torch_eager", "torch_compile")


def build_e2e(out_dir: str, layers: int | None = None, target: str = "cuda", max_batch: int = 64,
              name: str = "llama8b") -> str:
    """Compile the benchmark model gated and dense with generation=True into DIR (e2e_gated.so, e2e_dense.so,
    e2e.json); on CUDA also gated without CUDA graphs (e2e_gated_nograph.so: what the graphs save, or the numbers
    where a capture fails)."""
    from dataclasses import asdict, replace

    import wide_tvm

    from .e2e_model import E2E_MODELS, import_for_benchmark

    cfg = E2E_MODELS[name]
    cfg = replace(cfg, num_layers=layers) if layers else cfg
    os.makedirs(out_dir, exist_ok=True)
    dtype = "float16" if target.startswith("cuda") else "float32"  # (the CPU's BLAS is fp32)
    libs = {}
    variants = [("gated", {}), ("dense", {"dense": True})]
    if target.startswith("cuda"):
        variants.append(("gated_nograph", {"cuda_graph": False}))
    for variant, options in variants:
        t0 = time.time()
        compiled = wide_tvm.compile(import_for_benchmark(cfg, dtype), target, generation=True, max_batch=max_batch,
                                    **options)
        lib = f"e2e_{variant}.so"
        compiled.export_library(os.path.join(out_dir, lib))
        dense_bytes, gated_bytes = _read_bytes(compiled)
        libs[variant] = {"library": lib, "layers": len(compiled.layers),
                         "weights": [[list(w.shape), str(w.dtype)] for w in compiled.model.weights],
                         "inputs": compiled.model.input_specs(), "generation": compiled.generation,
                         "kv_cache": asdict(compiled.kv_cache), "blas": compiled.meta()["blas"],
                         "dense_read_bytes": dense_bytes, "gated_read_bytes": gated_bytes,
                         "weight_names": compiled.model.weight_names, "weight_origins": compiled.weight_origins,
                         "compile_s": round(time.time() - t0, 1)}
        print(f"{variant}: {lib} ({len(compiled.layers)} gated layers, {time.time() - t0:.0f} s)", flush=True)
    with open(os.path.join(out_dir, "e2e.json"), "w") as f:
        json.dump({"model": name, "config": json.loads(cfg.to_json()), "target": target, "dtype": dtype,
                   "libraries": libs}, f, indent=1)
    return out_dir


def _read_bytes(compiled) -> tuple[int, int]:
    """(bytes of the weights a one-token forward reads whole, bytes of those the gated kernels read only the active
    groups of): a gated weight's repacked copy is what its kernel reads; the stored original beside it only the
    dense fallback does (not at one token)."""
    gated = {w for layer in compiled.layers for w in layer.weights}
    names = compiled.model.weight_names
    copied = {n.rsplit(".", 1)[0] for n in names if n.rsplit(".", 1)[0] in gated and n not in gated}
    dense = partial = 0
    for name, w in zip(names, compiled.model.weights):
        size = int(w.size) * w.dtype.itemsize
        if name in copied or "embed" in name:
            continue  # (the fallback's; the embedding table, of which a token reads one row)
        if name in gated or name.rsplit(".", 1)[0] in gated:
            partial += size
        else:
            dense += size
    return dense, partial


def _cuda_time(fn, reps: int) -> float:
    """Median seconds of fn() (which returns once its result is on the host, or synchronises)."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _record_ttft(out: dict, name: str, prompt: int, first_token) -> None:
    """Warm once, then the median of 5 (out["ttft_ms"][prompt])."""
    first_token()
    out["ttft_ms"][str(prompt)] = _cuda_time(first_token, 5) * 1e3
    print(f"{name}: TTFT at {prompt:5d} tokens {out['ttft_ms'][str(prompt)]:8.2f} ms", flush=True)


def _record_decode(out: dict, name: str, context: int, batch: int, step, steps: int) -> None:
    """Three warm steps (CUDA graphs captured, torch.compile compiled), then `steps` timed back to back."""
    for _ in range(3):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    seconds = (time.perf_counter() - t0) / steps
    out["step_ms"][str(context)][str(batch)] = seconds * 1e3
    out["decode_tok_s"][str(context)][str(batch)] = batch / seconds
    print(f"{name}: decode ctx {context:5d} batch {batch:3d}: {seconds * 1e3:8.2f} ms/step "
          f"{batch / seconds:9.1f} tok/s", flush=True)


def _bandwidth(device: str) -> float | None:
    """Device-to-device copy bandwidth in bytes/s (read + write of 2 GiB); None off the GPU."""
    import torch

    if device != "cuda":
        return None
    x = torch.empty(1 << 30, dtype=torch.float16, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    torch.cuda.synchronize()
    return 2 * (1 << 31) / _cuda_time(lambda: (y.copy_(x), torch.cuda.synchronize()), 10)


def kernel_kind(name: str) -> str:
    """A kernel's share of a decode step: "gated" (ours: wide_*), "dense" (cuBLAS / cuBLASLt), "attention" (the paged
    KV cache's), or "other" (norms, RoPE, casts, sampling)."""
    low = name.lower()
    if "wide_" in low:
        return "gated"
    if any(k in low for k in ("nvjet", "gemm", "cutlass", "xmma", "cublas")):
        return "dense"
    if any(k in low for k in ("batch_decode", "batch_prefill", "attention", "kv_cache", "paged", "append",
                              "merge_state", "copy_single_page")):
        return "attention"
    return "other"


def _breakdown(step, iters: int) -> dict:
    """Device time per decode step by kernel kind (CUPTI through torch.profiler), and the step's wall time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / iters * 1e6
    out = {"gated": 0.0, "dense": 0.0, "attention": 0.0, "other": 0.0}
    launches = 0
    for e in prof.events():
        if e.device_type.name == "CUDA" and e.device_time_total > 0:
            out[kernel_kind(e.name)] += e.device_time_total / iters
            launches += 1
    return {**{k: round(v, 1) for k, v in out.items()}, "launches": launches / iters,
            "wall_profiled": round(wall, 1)}


def _memory_gib(device: str) -> float | None:
    import torch

    if device != "cuda":
        return None
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def run_ours(spec: dict, build_dir: str, variant: str, prompts, batches, contexts, steps: int,
             active: float = 0.5, save=lambda out: None) -> dict:
    """Our engine's rows for one library, timed on its device functions (wide_tvm/engine.py: Steps), on the
    weights of the PyTorch WIDE model (bench/e2e_weights.py) whose routers execute `active` of the groups; first its
    stateless `main` against that model on 16 tokens. `save(out)` runs after each measurement (what a row that
    runs out of time still reports)."""
    from types import SimpleNamespace

    import numpy as np
    import torch
    import tvm
    from tvm.runtime import vm as rvm

    from ..blas.libraries import load as load_blas
    from ..engine import Steps
    from ..runtime import ensure_cuda_runtime
    from ..sampling import SamplingParams
    from ..model.config import WideConfig
    from .e2e_weights import active_share, calibrate, library_weights, main_against, reference_model

    lib = spec["libraries"][variant]
    device = "cuda" if spec["target"].startswith("cuda") else "cpu"
    if device == "cuda":
        ensure_cuda_runtime(tvm)
    load_blas(lib["blas"])  # (the vendor BLAS the library links: blas/libraries.py)
    dev = tvm.cuda(0) if device == "cuda" else tvm.cpu(0)
    vm = rvm.VirtualMachine(tvm.runtime.load_module(os.path.join(build_dir, lib["library"])), dev)
    reference = reference_model(WideConfig(**spec["config"]), torch.device(device), seed=0,
                                dtype=getattr(torch, spec.get("dtype", "float16")))
    calibrate(reference, active)
    share = active_share(reference)
    tensors = library_weights(lib, reference.state_dict())
    weights = [tvm.runtime.from_dlpack(w) for w in tensors]
    got, want = main_against(vm, weights, reference)
    error = float((got - want).abs().max() / want.abs().max())
    print(f"{variant}: {share:.1%} of the groups active; main vs the PyTorch model: {error:.2e} of the largest "
          "logit", flush=True)
    del reference, want, got
    if device == "cuda":
        torch.cuda.empty_cache()
    weight_bytes = lib["dense_read_bytes"] + lib["gated_read_bytes"]
    vocab = spec["config"]["vocab_size"]
    capacity = max(max(batches) * (max(contexts) + steps + 32), max(prompts) + 32)
    steps_ = Steps(SimpleNamespace(vm=vm, weights=weights, device=dev), max(batches), capacity, max(prompts), vocab)
    greedy = SamplingParams(max_new_tokens=1)
    rng = np.random.default_rng(0)
    out = {"weight_bytes": weight_bytes, "gated_weight_bytes": lib["gated_read_bytes"], "ttft_ms": {},
           "step_ms": {}, "decode_tok_s": {}, "active_share": share, "main_vs_torch": error}
    for p in prompts:
        ids = rng.integers(0, vocab, p).tolist()

        def first_token():
            steps_.add(0)
            steps_.sample(steps_.prefill([0], [p], ids, [p - 1]), [greedy], [None])
            steps_.remove(0)

        _record_ttft(out, variant, p, first_token)
        save(out)
    for c in contexts:
        out["step_ms"][str(c)], out["decode_tok_s"][str(c)] = {}, {}
        for b in batches:
            seqs = list(range(b))
            for s in seqs:
                steps_.add(s)
            per_call = max(1, max(prompts) // c)
            for i in range(0, b, per_call):
                group = seqs[i:i + per_call]
                steps_.prefill(group, [c] * len(group), rng.integers(0, vocab, c * len(group)).tolist(),
                               [c * len(group) - 1])
            tokens = [rng.integers(0, vocab, b).tolist()]

            def step():  # (the new ids on the host: what the next step feeds)
                tokens[0] = steps_.sample(steps_.decode(seqs, tokens[0]), [greedy] * b, [None] * b)

            _record_decode(out, variant, c, b, step, steps)
            out["memory_gib"] = _memory_gib(device)
            save(out)
            if device == "cuda" and b == 1 and c == min(contexts):
                out["decode_breakdown_us"] = _breakdown(step, 8)
                print(f"{variant}: decode step at batch 1 by kernel (us): {out['decode_breakdown_us']}", flush=True)
            for s in seqs:
                steps_.remove(s)
    return out


def run_torch(cfg_dict: dict, compiled: bool, prompts, batches, contexts, steps: int, device: str,
              save=lambda out: None) -> dict:
    import torch

    from ..model.config import WideConfig
    from .torch_llama import random_model

    cfg = WideConfig(**cfg_dict)
    max_seq = max(max(contexts) + steps + 8, max(prompts))
    model = random_model(cfg, max(batches), max_seq, device, torch.float16 if device == "cuda" else torch.float32)
    forward = torch.compile(model, mode="reduce-overhead", fullgraph=True) if compiled else model
    name = "torch_compile" if compiled else "torch_eager"
    out = {"ttft_ms": {}, "step_ms": {}, "decode_tok_s": {},
           "weight_bytes": sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed" not in n)}
    with torch.no_grad():
        for p in prompts:
            ids = torch.randint(0, cfg.vocab_size, (1, p), device=device)
            pos = torch.arange(p, device=device)

            def first_token():
                return int(forward(ids, pos)[0, -1].argmax())

            first_token()  # (torch.compile: the compilation)
            _record_ttft(out, name, p, first_token)
            save(out)
        for c in contexts:
            out["step_ms"][str(c)], out["decode_tok_s"][str(c)] = {}, {}
            for b in batches:
                tokens = [torch.randint(0, cfg.vocab_size, (b, 1), device=device)]
                pos = torch.tensor([c], device=device)

                def step():  # (the ids on the host every step, as an engine needs them)
                    tokens[0] = forward(tokens[0], pos)[:, -1].argmax(-1, keepdim=True).clone()
                    tokens[0].tolist()

                _record_decode(out, name, c, b, step, steps)
                save(out)
    out["memory_gib"] = _memory_gib(device)
    return out


def run_row(build_dir: str, row: str, out_json: str, prompts=PROMPTS, batches=BATCHES, contexts=CONTEXTS,
            steps: int = STEPS) -> None:
    """One row (in this process), written to `out_json` after each measurement ("partial": true until the row is
    whole)."""
    with open(os.path.join(build_dir, "e2e.json")) as f:
        spec = json.load(f)
    device = "cuda" if spec["target"].startswith("cuda") else "cpu"

    def save(out: dict, partial: bool = True) -> None:
        with open(out_json + ".tmp", "w") as f:
            json.dump({**out, "partial": partial}, f, indent=1)
        os.replace(out_json + ".tmp", out_json)

    if row.startswith("ours_"):
        variant, _, share = row[5:].partition("@")  # ours_gated@0.25: a quarter of the groups active
        result = run_ours(spec, build_dir, variant, prompts, batches, contexts, steps, float(share or 0.5), save)
    else:
        result = run_torch(spec["config"], row == "torch_compile", prompts, batches, contexts, steps, device, save)
    bandwidth = _bandwidth(device)
    result["bandwidth_gb_s"] = bandwidth / 1e9 if bandwidth else None
    save(result, partial=False)


def run_e2e(build_dir: str, json_path: str, rows=ROWS, prompts=PROMPTS, batches=BATCHES, contexts=CONTEXTS,
            steps: int = STEPS, timeout: float = 900, compile_prompts=None, compile_batches=None) -> dict:
    """Every row in its own process (each frees all its GPU memory), then one JSON with the table's numbers.
    `compile_prompts` / `compile_batches`: the torch.compile row's own (each shape is a compilation of minutes)."""
    import torch

    with open(os.path.join(build_dir, "e2e.json")) as f:
        spec = json.load(f)
    device = torch.cuda.get_device_name(0) if spec["target"].startswith("cuda") else "cpu"
    result = {"kind": "e2e", "device": device, "rows": {}, "errors": {}, "model": spec["config"],
              "dtype": spec.get("dtype", "float16"),
              "prompts": list(prompts), "batches": list(batches), "contexts": list(contexts), "steps": steps}
    code = ("import sys, json; from wide_tvm.bench.e2e import run_row; a = json.loads(sys.argv[1]); "
            "run_row(**a)")
    for row in rows:
        part = f"{json_path}.{row}.json"
        compiled = row == "torch_compile"
        args = {"build_dir": build_dir, "row": row, "out_json": part,
                "prompts": list(compile_prompts if compiled and compile_prompts else prompts),
                "batches": list(compile_batches if compiled and compile_batches else batches),
                "contexts": list(contexts), "steps": steps}
        try:
            done = subprocess.run([sys.executable, "-c", code, json.dumps(args)], timeout=timeout,
                                  capture_output=True, text=True)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            print(out, end="", flush=True)
            result["errors"][row] = f"timed out after {timeout:.0f} s"
            done = None
        if done is not None:
            print(done.stdout, end="", flush=True)
            if done.returncode != 0:
                lines = (done.stderr or "").strip().splitlines()
                result["errors"][row] = lines[-1] if lines else f"exit code {done.returncode}"
                print(f"{row}: failed: {result['errors'][row]}", flush=True)
        if not os.path.exists(part):
            continue  # (what it measured before it stopped, if anything, is kept: "partial": true)
        with open(part) as f:
            result["rows"][row] = json.load(f)
        os.remove(part)
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1)
    return result
