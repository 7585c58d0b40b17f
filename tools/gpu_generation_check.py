"""On the GPU host: greedy generation with a CUDA library compiled with --generation (the fp16 example model of
tools/build_gpu_run.sh, gpu_run/gen/) against the same model in PyTorch on the GPU, which recomputes the whole
sequence each step. fp16: reports the tokens up to the first divergence and the first step's logits error.
    python3 tools/gpu_generation_check.py gpu_run/gen/gen_fp16.so [--json OUT]"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("library")
    p.add_argument("--new", type=int, default=16)
    p.add_argument("--json")
    args = p.parse_args(argv)
    import numpy as np
    import torch

    import wide_tvm
    from wide_tvm.engine import Engine
    from wide_tvm.model import WideConfig, build_example

    cfg = WideConfig()
    model = build_example(cfg, seed=3).half().cuda().eval()
    engine = Engine(wide_tvm.load(args.library, "cuda"), max_batch=4, max_total_tokens=1024)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in (1, 6, 13)]
    results = engine.generate(prompts, max_new_tokens=args.new)
    rows = []
    for prompt, result in zip(prompts, results):
        seq, ref = list(prompt), []
        with torch.no_grad():
            for _ in range(args.new):
                logits = model(torch.tensor([seq], device="cuda"))
                ref.append(int(logits[0, -1].argmax()))
                seq.append(ref[-1])
        same = next((i for i, (a, b) in enumerate(zip(result.token_ids, ref)) if a != b), len(ref))
        rows.append({"prompt_tokens": len(prompt), "ours": result.token_ids, "torch": ref, "identical_prefix": same})
        print(f"prompt of {len(prompt):2d}: {same}/{len(ref)} tokens identical to PyTorch fp16")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
