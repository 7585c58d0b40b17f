"""Console scripts: wide-export, wide-compile, wide-run. Errors are one line on stderr, exit code 2."""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import warnings

from .errors import WideError


def _fail(err: Exception) -> int:
    print(f"error: {err}", file=sys.stderr)
    return 2


def export_main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="wide-export", description="Build a WIDE model and export it to ONNX / .pt2.")
    p.add_argument("-o", "--output", action="append", required=True,
                   help="output file, .onnx or .pt2 (repeat for both)")
    p.add_argument("--config", help="WideConfig as JSON (default: the bundled tiny example)")
    p.add_argument("--seed", type=int, default=0, help="seed of the deterministic example weights")
    p.add_argument("--tokens", type=int, default=7, help="token count of the example input used for tracing")
    args = p.parse_args(argv)
    try:
        from .frontends.export import export_model
        from .model import WideConfig, build_example, example_inputs

        try:
            cfg = WideConfig.from_json(args.config) if args.config else WideConfig()
        except (ValueError, TypeError) as err:
            raise WideError(f"--config: {err}") from None
        model = build_example(cfg, seed=args.seed)
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
    args = p.parse_args(argv)
    try:
        from . import compile as wide_compile

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled = wide_compile(args.model, args.target, args.tuning_log)
        for w in caught:
            if w.category.__name__ == "NoGatedLayersWarning":
                print(f"warning: {w.message}", file=sys.stderr)
        compiled.export(args.output)
        print(compiled.summary())
        print(f"wrote {args.output}")
    except WideError as err:
        return _fail(err)
    return 0


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
