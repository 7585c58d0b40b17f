"""On the GPU host: generation with a CUDA library compiled with --generation (the fp16 example model of
tools/build_gpu_run.sh, gpu_run/gen/) against the same model in PyTorch on the GPU, which recomputes the whole
sequence each step. fp16: reports the tokens up to the first divergence; then batched == alone, seeded sampling
run to run, and the wall time per generated token (the engine's whole step: decode, sampling, the copy back).
    python3 tools/gpu_generation_check.py gpu_run/gen/gen_fp16.so [--json OUT]"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("library")
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--json")
    args = p.parse_args(argv)
    import numpy as np
    import torch

    import wide_tvm
    from wide_tvm.model import WideConfig, build_example

    cfg = WideConfig()
    model = build_example(cfg, seed=3).half().cuda().eval()
    loaded = wide_tvm.load(args.library, "cuda")
    engine = loaded.engine(max_batch=4, max_total_tokens=2048)
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
    # the logits themselves: prefill's at the last prompt token, then one decode step's, against PyTorch fp16
    from wide_tvm.engine import Steps

    steps = Steps(loaded, 4, 2048, 2048, cfg.vocab_size)
    errors = []
    for i, prompt in enumerate(prompts):
        steps.add(100 + i)
        ours = [steps.prefill([100 + i], [len(prompt)], prompt, [len(prompt) - 1]).numpy()[0, 0]]
        nxt = int(ours[0].argmax())
        ours.append(steps.decode([100 + i], [nxt]).numpy()[0, 0])
        steps.remove(100 + i)
        with torch.no_grad():
            ref = model(torch.tensor([prompt + [nxt]], device="cuda"))[0, -2:].float().cpu().numpy()
        errors.append(float(max(np.abs(o.astype("float32") - r).max() / np.abs(r).max() for o, r in zip(ours, ref))))
    print(f"prefill / decode logits vs PyTorch fp16: max error {max(errors):.2e} of the largest logit")
    alone = [engine.generate([q], max_new_tokens=args.new)[0].token_ids for q in prompts]
    batched_equal = alone == [r.token_ids for r in results]
    opts = dict(max_new_tokens=args.new, temperature=0.8, top_p=0.9, top_k=40, seed=11)
    sampled = [r.token_ids for r in engine.generate(prompts, **opts)]
    seeded_equal = sampled == [r.token_ids for r in engine.generate(prompts, **opts)]
    print(f"batched == alone: {batched_equal}; seeded sampling run to run: {seeded_equal}")
    timing = {}
    for batch in (1, 4):
        engine.generate(prompts[:1] * batch, max_new_tokens=8)  # (warm: CUDA graphs of this batch captured)
        for greedy in (True, False):
            t0 = time.perf_counter()
            out = engine.generate(prompts[:1] * batch, max_new_tokens=129, temperature=0 if greedy else 0.8, seed=1,
                                  ignore_eos=True)
            per_step = (time.perf_counter() - t0) / 128 * 1e6
            assert all(len(o.token_ids) == 129 for o in out)
            timing[f"batch{batch}_{'greedy' if greedy else 'sampled'}_us_per_step"] = per_step
            print(f"batch {batch} {'greedy' if greedy else 'top-p sampled'}: {per_step:8.1f} us per decode step "
                  "(wall, prefill amortised)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "generation": loaded.meta.get("generation"),
                       "rows": rows, "logits_max_rel_error": max(errors), "batched_equals_alone": batched_equal, "seeded_sampling_repeats": seeded_equal,
                       "timing": timing}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
