"""Console scripts: wide-export, wide-compile, wide-run. Errors are one line on stderr, exit code 2."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import warnings

from .compiler import prepare_builds
from .errors import WideError


def _fail(err: Exception) -> int:
    print(f"error: {err}", file=sys.stderr)
    return 2


def export_main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="wide-export",
        description="Export a WIDE model to ONNX / .pt2: a Hugging Face base with WIDE's router (and LoRA) "
                    "checkpoints, or the bundled tiny example.")
    p.add_argument("-o", "--output", action="append", required=True,
                   help="output file, .onnx or .pt2 (repeat for both)")
    hf = p.add_argument_group("WIDE checkpoint (Hugging Face Llama / Qwen3 base)")
    hf.add_argument("--hf-model", metavar="DIR", help="local transformers model folder (config.json + weights)")
    hf.add_argument("--routers", metavar="router.pth", help="WIDE stage-1 router state dict")
    hf.add_argument("--lora", metavar="lora.pth", help="WIDE stage-2 LoRA state dict, merged into the base")
    hf.add_argument("--lora-alpha", type=float, help="LoRA alpha (the update is B @ A * alpha / r)")
    hf.add_argument("--attn-group-size", type=int, help="query heads per gated attention group "
                    "(default: inferred from the router shapes)")
    hf.add_argument("--ffn-group-size", type=int, help="FFN channels per gated group (default: inferred)")
    hf.add_argument("--rank", type=int, help="router rank (default: inferred; checked when given)")
    ex = p.add_argument_group("bundled example")
    ex.add_argument("--config", help="WideConfig as JSON (default: the bundled tiny example)")
    ex.add_argument("--seed", type=int, default=0, help="seed of the deterministic example weights")
    p.add_argument("--tokens", type=int, default=7, help="token count of the example input used for tracing")
    p.add_argument("--attention", choices=("eager", "sdpa"), default="eager",
                   help="attention as written-out scores and softmax (default), or one scaled_dot_product_attention "
                        "call per layer (as Hugging Face runs it)")
    args = p.parse_args(argv)
    try:
        from .frontends.export import export_model
        from .model import WideConfig, build_example, example_inputs

        if args.hf_model or args.routers:
            if not (args.hf_model and args.routers):
                raise WideError("--hf-model and --routers go together (a base model and its WIDE routers)")
            if args.config:
                raise WideError("--config is for the bundled example; a WIDE checkpoint takes its sizes from --hf-model")
            from .frontends.hf_checkpoint import load_wide_checkpoint

            ckpt = load_wide_checkpoint(args.hf_model, args.routers, args.lora,
                                        attn_group_size=args.attn_group_size, ffn_group_size=args.ffn_group_size,
                                        rank=args.rank, lora_alpha=args.lora_alpha)
            model, cfg = ckpt.model, ckpt.config
            print(f"{args.hf_model}: {cfg.num_layers} layers; attention {cfg.attn_groups} groups x "
                  f"{cfg.attn_group_size} heads, FFN {cfg.ffn_groups} groups x {cfg.ffn_group_size} channels, "
                  f"router rank {cfg.router_rank}; LoRA merged into {len(ckpt.lora_modules)} modules")
        else:
            if args.lora or args.attn_group_size or args.ffn_group_size or args.rank:
                raise WideError("--lora/--attn-group-size/--ffn-group-size/--rank need --hf-model and --routers")
            try:
                cfg = WideConfig.from_json(args.config) if args.config else WideConfig()
            except (ValueError, TypeError) as err:
                raise WideError(f"--config: {err}") from None
            model = build_example(cfg, seed=args.seed)
        cfg.attention = args.attention  # (the model's layers read their config when they run)
        for out in args.output:
            with contextlib.redirect_stdout(io.StringIO()):
                export_model(model, example_inputs(cfg, args.tokens), out)
            print(f"wrote {out}")
    except WideError as err:
        return _fail(err)
    return 0


def compile_main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="wide-compile", description="Compile a WIDE model into a TVM library.")
    p.add_argument("model", help="MODEL.onnx or MODEL.pt2")
    p.add_argument("--target", default="llvm",
                   help="llvm, cuda (sm_90), cuda:sm_XX, a TVM tag (nvidia/nvidia-h100) or target JSON")
    p.add_argument("-o", "--output", required=True, help="OUT.so (weights go to OUT.weights.npz)")
    p.add_argument("--tuning-log", help="MetaSchedule database folder (default: tuning_logs/<target>/ if present)")
    p.add_argument("--strict", action="store_true",
                   help="fail (exit 2) when a router's gate is not recognised, instead of compiling its layer dense")
    p.add_argument("--no-dependent-launch", action="store_true",
                   help="sm_90+: launch the gated kernels plainly, not as programmatic dependents of the kernel before "
                        "them (for drivers or runtimes without programmatic dependent launch)")
    p.add_argument("--no-blas", action="store_true",
                   help="leave the dense matmuls to TVM's own kernels instead of the vendor BLAS (cuBLASLt from the "
                        "nvidia-cublas wheel on CUDA, OpenBLAS from scipy-openblas32 on the CPU)")
    p.add_argument("--fallback", choices=("auto", "off", "always"), default="auto",
                   help="where the vendor BLAS on the masked operand beats a gated kernel, run it instead: auto (the "
                        "tuning folders' measured crossovers, else a cost model; keeps a second copy of repacked "
                        "weights), off, always (every token count; for checks)")
    p.add_argument("--generation", action="store_true",
                   help="also build the entry points generation needs: prefill and decode over a paged KV cache, "
                        "the cache's creation, sampling on the device (wide-generate, wide-serve)")
    p.add_argument("--max-batch", type=int, default=64,
                   help="with --generation: the most sequences one decode step takes (default 64)")
    p.add_argument("--no-cuda-graph", action="store_true",
                   help="with --generation on CUDA: launch decode steps kernel by kernel, not as CUDA graphs")
    args = p.parse_args(argv)
    try:
        from . import compile as wide_compile
        from .artifact import check_output

        from .frontends import check_model_file

        check_model_file(args.model)  # before TVM and torch load: a wrong path fails at once
        check_output(args.output, (args.model,))  # before the build: a path that cannot take the library fails now

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled = wide_compile(args.model, args.target, args.tuning_log,
                                    dependent_launch=not args.no_dependent_launch, strict=args.strict,
                                    blas=not args.no_blas, fallback=args.fallback, generation=args.generation,
                                    max_batch=args.max_batch, cuda_graph=False if args.no_cuda_graph else None)
        shown = set()
        for w in caught:  # the warnings a user acts on, once each (TVM's and torch's own stay silent)
            if w.category.__name__ in ("NoGatedLayersWarning", "UnloweredGateWarning", "TornRecordWarning",
                                       "StaleTuningWarning") and str(w.message) not in shown:
                shown.add(str(w.message))
                print(f"warning: {w.message}", file=sys.stderr)
        compiled.export(args.output)
        print(compiled.summary())
        print(f"wrote {args.output}")
    except WideError as err:
        return _fail(err)
    return 0


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--tokenizer", metavar="DIR", help="a Hugging Face model folder: its tokenizer.json and chat "
                                                       "template (text prompts and output)")
    p.add_argument("--max-batch", type=int, help="sequences decoded together (default: what the library takes)")
    p.add_argument("--max-total-tokens", type=int, default=4096,
                   help="the KV cache's capacity over all sequences (default 4096); requests beyond it wait")
    p.add_argument("--prefill-chunk", type=int, default=2048, help="the most prompt tokens one prefill step takes")


def _engine(args):
    from . import load

    model = load(args.library, args.device, args.tokenizer)
    model.engine(max_batch=args.max_batch, max_total_tokens=args.max_total_tokens, prefill_chunk=args.prefill_chunk)
    return model


def generate_main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="wide-generate",
                                description="Generate with a library compiled with --generation; streams the new "
                                            "tokens to stdout (text with --tokenizer, else ids), one line per prompt.")
    p.add_argument("library", help="OUT.so from wide-compile --generation")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--ids", action="append", type=_id_list, metavar="ID,ID,...",
                        help="a prompt as comma-separated token ids (repeat for a batch)")
    prompt.add_argument("--prompt", action="append", metavar="TEXT", help="a text prompt (repeat for a batch; "
                                                                          "needs --tokenizer)")
    p.add_argument("--chat", action="store_true", help="wrap each text prompt as a user message in the chat template")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 (default): no limit")
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", type=_id_list, default=[], metavar="ID,...", help="token ids that end a sequence")
    p.add_argument("--stop-text", action="append", default=[], metavar="TEXT", help="a string that ends a sequence")
    _sampling_args(p)
    args = p.parse_args(argv)
    try:
        model = _engine(args)
        prompts = args.ids or args.prompt
        if args.chat:
            if args.ids or model.tokenizer is None:
                raise WideError("--chat takes --prompt text and a --tokenizer")
            prompts = [model.tokenizer.chat([{"role": "user", "content": t}]) for t in prompts]
        text = model.tokenizer is not None
        options = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                       top_k=args.top_k, stop=[*args.stop, *args.stop_text], seed=args.seed)
        if len(prompts) == 1:  # one prompt: each token as it is generated
            for event in model.generate(prompts, stream=True, **options):
                if event.token_id is not None:
                    print(event.text if text else event.token_id, end="" if text else " ", flush=True)
            print()
        else:
            for result in model.generate(prompts, **options):
                print(result.text if text else " ".join(str(t) for t in result.token_ids), flush=True)
    except WideError as err:
        return _fail(err)
    return 0


def serve_main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="wide-serve",
                                description="An OpenAI-compatible server (/v1/completions, /v1/chat/completions, "
                                            "/v1/models, /health) over a library compiled with --generation.")
    p.add_argument("library", help="OUT.so from wide-compile --generation")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--name", help="the model's name in the API (default: the library's file name)")
    _sampling_args(p)
    args = p.parse_args(argv)
    try:
        if not args.tokenizer:
            raise WideError("wide-serve needs --tokenizer DIR (a Hugging Face model folder with tokenizer.json)")
        model = _engine(args)
        from .server import serve

        name = args.name or os.path.splitext(os.path.basename(args.library))[0]
        print(f"serving {name} on http://{args.host}:{args.port}/v1", flush=True)
        serve(model, name, args.host, args.port)
    except WideError as err:
        return _fail(err)
    return 0


def _id_list(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integer token ids") from None


def run_main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="wide-run", description="Run a compiled WIDE library with the TVM runtime.")
    p.add_argument("library", help="OUT.so from wide-compile")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--inputs", required=True, help=".npz holding the model inputs by name (e.g. input_ids)")
    p.add_argument("--save", help="write the outputs to this .npz")
    args = p.parse_args(argv)
    try:
        import numpy as np

        from . import load

        if not os.path.isfile(args.inputs):
            raise WideError(f"{args.inputs}: no such inputs file")
        model = load(args.library, args.device)
        try:
            with np.load(args.inputs) as data:
                missing = [n for n in model.input_names if n not in data.files]
                if missing:
                    raise WideError(f"{args.inputs}: missing input(s) {missing}; has {data.files}")
                inputs = [data[n] for n in model.input_names]
        except (OSError, ValueError) as err:
            raise WideError(f"{args.inputs}: cannot read inputs ({err})") from None
        out = model(*inputs)
        print(f"output: shape {tuple(out.shape)} dtype {out.dtype} mean {float(out.mean()):.6g}")
        if args.save:
            np.savez(args.save, logits=out)
            print(f"wrote {args.save}")
    except WideError as err:
        return _fail(err)
    return 0


def bench_main(argv=None) -> int:
    from .bench.measure import TIMERS
    from .bench.workloads import SWEEPS

    p = argparse.ArgumentParser(prog="wide-bench", description="Gated kernels vs cuBLAS, TVM dense and the roofline.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the benchmark kernels (no GPU needed)")
    b.add_argument("dir")
    b.add_argument("--target", default="cuda")
    b.add_argument("--sweep", nargs="?", const="all", choices=SWEEPS,
                   help="also build every knob candidate (all), the many-token tile kernels' alone (tiles), or the "
                        "Hopper wgmma GEMMs' alone (wgmma)")
    b.add_argument("--workloads", choices=("llama8b", "untuned"), default="llama8b",
                   help="llama8b: the tuned Llama-3.1-8B shapes (default); untuned: Qwen2.5-7B and Mistral-Nemo FFNs, "
                        "shapes no shipped tuning holds")
    b.add_argument("--no-derived", action="store_true",
                   help="untuned shapes on the generic default knobs instead of the nearest tuned shape's")
    b.add_argument("--records-of", metavar="REV",
                   help="apply the database records stamped by git revision REV's kernel code (the A/B of a kernel "
                        "edit before its records are re-stamped); bench.json says so")
    r = sub.add_parser("run", help="time them on the GPU (TVM runtime only); writes JSON")
    r.add_argument("dir")
    r.add_argument("--json", required=True)
    r.add_argument("--tokens", type=int, nargs="+")
    r.add_argument("--sparsity", type=float, nargs="+")
    r.add_argument("--masks", nargs="+")
    r.add_argument("--only", nargs="+", help="workload names")
    r.add_argument("--draws", type=int, default=8,
                   help="masks drawn per row; the timed calls cycle through them (default 8)")
    r.add_argument("--sweep", action="store_true",
                   help="time the knob candidates of a `build --sweep` directory instead (interleaved), pick per bucket")
    r.add_argument("--timer", choices=TIMERS, default="events",
                   help="events: CUDA events after an L2 flush by a read (default); do_bench: triton's do_bench, "
                        "whose L2 flush leaves dirty lines that the timed call writes back")
    c = sub.add_parser("cpu", help="time the llvm kernels on this machine's CPU; writes JSON")
    c.add_argument("--json", required=True)
    c.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 64])
    c.add_argument("--dtype", nargs="+", help="weight and activation dtypes to time (the kernels accumulate in "
                   "fp32; default: all the CPU kernels take, float32 float16 bfloat16)")
    c.add_argument("--target", default="llvm", help="llvm (this machine's CPU, the default) or llvm:CPU (an LLVM "
                   "CPU name; llvm:generic is x86-64 without AVX, as TVM's plain llvm target compiles)")
    db = sub.add_parser("dense-build", help="compile every dense matmul shape of Llama-3.1-8B (bench/dense.py)")
    db.add_argument("dir")
    db.add_argument("--target", default="cuda", help="cuda (fp16, cuBLASLt) or llvm (fp32, OpenBLAS)")
    db.add_argument("--dtype", choices=("float32", "float16", "bfloat16"),
                    help="default: float16 on cuda, float32 on llvm (whose fp16 / bf16 OpenBLAS computes in fp32)")
    dr = sub.add_parser("dense-run", help="time them against torch.matmul where they run; writes JSON")
    dr.add_argument("dir")
    dr.add_argument("--json", required=True)
    dr.add_argument("--tokens", type=int, nargs="+")
    mb = sub.add_parser("model-build", help="compile a whole 2-layer model gated and dense (bench/model.py)")
    mb.add_argument("dir")
    mb.add_argument("--target", default="cuda")
    mr = sub.add_parser("model-run", help="time it against the same model in PyTorch where it runs; writes JSON")
    mr.add_argument("dir")
    mr.add_argument("--json", required=True)
    mr.add_argument("--tokens", type=int, nargs="+")
    eb = sub.add_parser("e2e-build", help="compile the end-to-end model (32 layers of Llama-3.1-8B) gated and dense "
                                          "with generation (bench/e2e.py)")
    eb.add_argument("dir")
    eb.add_argument("--layers", type=int, help="fewer layers (a quick run)")
    eb.add_argument("--max-batch", type=int, default=64)
    eb.add_argument("--model", default="llama8b", help="llama8b (the GPU's), llama1b (the CPU's) or tiny")
    eb.add_argument("--target", default="cuda", help="cuda (fp16) or llvm (fp32)")
    er = sub.add_parser("e2e", help="TTFT and decode tokens/s of our engine against PyTorch where it runs; JSON")
    er.add_argument("dir")
    er.add_argument("--json", required=True)
    er.add_argument("--rows", nargs="+", default=["ours_gated", "ours_dense", "torch_eager", "torch_compile"])
    er.add_argument("--prompts", type=int, nargs="+", default=[128, 512, 2048, 4096])
    er.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    er.add_argument("--contexts", type=int, nargs="+", default=[512, 4096])
    er.add_argument("--steps", type=int, default=32)
    er.add_argument("--compile-prompts", type=int, nargs="+", help="the torch.compile row's prompts (default: all)")
    er.add_argument("--compile-batches", type=int, nargs="+", help="the torch.compile row's batches (default: all)")
    er.add_argument("--timeout", type=float, default=900, help="seconds per row")
    rep = sub.add_parser("report", help="Markdown table and plot from the JSON")
    rep.add_argument("json")
    rep.add_argument("--plot", help="write a PNG here")
    rep.add_argument("--sparsity", type=float, default=0.5)
    rep.add_argument("--mask", default="random")
    args = p.parse_args(argv)
    if args.cmd == "run" and args.draws < 1:
        p.error(f"--draws {args.draws}: draw at least 1 mask per row")
    if args.cmd == "run" and any(not 0 <= s <= 1 for s in args.sparsity or ()):
        p.error(f"--sparsity {' '.join(map(str, args.sparsity))}: each must be in [0, 1] (1: every group skipped)")
    try:
        if args.cmd in ("build", "cpu", "dense-build", "model-build", "e2e-build"):
            prepare_builds()
        if args.cmd == "e2e-build":
            from .bench.e2e import build_e2e

            print(f"wrote {build_e2e(args.dir, args.layers, args.target, args.max_batch, args.model)}")
        elif args.cmd == "e2e":
            from .bench.e2e import run_e2e
            from .bench.e2e_report import markdown

            print(markdown(run_e2e(args.dir, args.json, args.rows, args.prompts, args.batches, args.contexts,
                                   args.steps, args.timeout, args.compile_prompts, args.compile_batches)))
        elif args.cmd == "build":
            from .bench.build import build

            from .bench.workloads import WORKLOAD_SETS

            out = build(args.dir, args.target, WORKLOAD_SETS[args.workloads], sweep=args.sweep,
                        records_of=args.records_of, derived=not args.no_derived)
            print(f"wrote {out}")
        elif args.cmd == "dense-build":
            from .bench.dense import build_dense

            print(f"wrote {build_dense(args.dir, args.target, dtype=args.dtype)}")
        elif args.cmd == "model-build":
            from .bench.model import build_model

            print(f"wrote {build_model(args.dir, args.target)}")
        elif args.cmd == "model-run":
            from .bench.model import run_model

            result = run_model(args.dir, args.tokens, json_path=args.json)
            print(f"wrote {args.json}: {len(result['rows'])} measurements")
        elif args.cmd == "dense-run":
            from .bench.dense_run import run_dense

            result = run_dense(args.dir, args.tokens, json_path=args.json)
            print(f"wrote {args.json}: {len(result['rows'])} measurements")
        elif args.cmd == "cpu":
            import json

            from .bench.cpu import run_cpu
            from .tuning.database import load as load_knobs
            from .tuning.folders import shipped_root
            from .targets import parse_target, target_folder

            tgt = parse_target(args.target)
            if tgt.kind.name != "llvm":
                raise WideError(f"wide-bench cpu times llvm kernels; --target {args.target} is not an llvm target")
            tuned = shipped_root() / target_folder(tgt)
            result = run_cpu(tuple(args.tokens), knobs=load_knobs(str(tuned)), target=args.target,
                             **({"dtypes": tuple(args.dtype)} if args.dtype else {}))
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
            print(f"wrote {args.json}")
        elif args.cmd == "run":
            from .bench import measure, workloads

            if args.sweep:
                import json

                tokens = args.tokens or measure.SWEEP_TOKENS + measure.PREFILL_SWEEP_TOKENS
                result = measure.sweep(args.dir, tuple(tokens), timer=args.timer)
                with open(args.json, "w") as f:
                    json.dump(result, f, indent=1)
                print(f"wrote {args.json}: best {result['best']}")
                return 0
            result = measure.run(args.dir, tuple(args.tokens or workloads.TOKENS),
                                 tuple(args.sparsity or workloads.SPARSITIES), tuple(args.masks or workloads.MASKS),
                                 args.only, json_path=args.json, timer=args.timer, draws=args.draws)
            print(f"wrote {args.json}: {len(result['rows'])} measurements")
        else:
            from .bench import report

            result = report.load(args.json)
            if result.get("kind") == "model":
                print(report.model_markdown(result))
                return 0
            if result.get("kind") == "e2e":
                from .bench import e2e_report

                print(e2e_report.markdown(result))
                if args.plot:
                    print(f"wrote {e2e_report.plot(result, args.plot)}")
                return 0
            if report.is_dense(result):
                print(report.dense_markdown(result))
                if args.plot:
                    print(f"wrote {report.dense_plot(result, args.plot)}")
                return 0
            if "best" in result:  # a knob sweep
                print(report.sweep_markdown(result))
                return 0
            if report.is_cpu(result):  # wide-bench cpu
                print(report.cpu_markdown(result))
                if args.plot:
                    print(f"wrote {report.cpu_plot(result, args.plot)}")
                return 0
            from .fallback import load_crossovers
            from .tuning.folders import shipped_root

            crossovers = load_crossovers([str(shipped_root() / "cuda-sm90")])  # (the picked path's decision)
            print(report.markdown(result, args.sparsity, args.mask, crossovers))
            if args.plot:
                print(f"wrote {report.plot(result, args.plot, args.mask)}")
    except WideError as err:
        return _fail(err)
    return 0


def tune_main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="wide-tune", description="Tune the gated kernels' knobs of a model for a target.")
    p.add_argument("model", nargs="?", help="MODEL.onnx or MODEL.pt2")
    p.add_argument("--target", default="llvm")
    p.add_argument("--out", help="tuning folder (default: the user's, ~/.cache/wide-tvm/tuning_logs/<target>/, which "
                   "wide-compile applies on top of the shipped tunings; $WIDE_TVM_TUNING_HOME moves it)")
    p.add_argument("--trials", type=int, default=None,
                   help="measured candidates per kernel and token bucket (default 16; fewer where the space is smaller)")
    p.add_argument("--show", action="store_true", help="print the database's tasks and fastest records, tune nothing")
    p.add_argument("--prune", action="store_true",
                   help="drop the database's records of older kernel code (after a re-tune), tune nothing")
    p.add_argument("--only", metavar="REGEX",
                   help="tune only the tasks whose name matches, e.g. 'g112x128.*tile' (kernel key/space bucket)")
    p.add_argument("--force", action="store_true",
                   help="measure --trials more candidates even for kernels the database already covers")
    p.add_argument("--from-sweep", nargs="+", metavar="SWEEP_JSON",
                   help="import GPU timings from `wide-bench run --sweep` (cuda targets); later files win")
    p.add_argument("--llama8b", action="store_true", help="tune the benchmark's Llama-3.1-8B kernels instead of a model's")
    p.add_argument("--crossover", nargs="+", metavar="RUN_JSON",
                   help="import where each kernel's dense fallback is faster, from `wide-bench run` timings of both "
                   "paths at 50%% random masks (cuda targets), into the folder's crossover.json")
    args = p.parse_args(argv)
    try:
        prepare_builds()
        from .targets import parse_target, target_folder
        from .tuning.driver import DEFAULT_TRIALS, tune
        from .tuning.folders import user_root

        out = args.out or str(user_root() / target_folder(parse_target(args.target)))
        if args.show:
            from .tuning.database import summary

            print(summary(out))
            return 0
        if args.prune:
            from .tuning.database import prune

            kept, dropped = prune(out)
            print(f"{out}: dropped {dropped} records of older kernel code, kept {kept}")
            return 0
        if args.crossover:
            from .tuning.crossover import import_runs

            try:
                path, count = import_runs(out, args.crossover)
            except (OSError, ValueError) as err:
                raise WideError(str(err)) from None
            print(f"wrote {path}: the measured crossovers of {count} kernels")
            return 0
        if args.from_sweep and args.trials is not None:
            raise WideError("--trials sets MetaSchedule's search; --from-sweep imports measurements instead")
        trials = DEFAULT_TRIALS if args.trials is None else args.trials
        print(f"wrote {tune(args.model, args.target, out, args.force, args.from_sweep, args.llama8b, trials, args.only)}")
    except WideError as err:
        return _fail(err)
    return 0
