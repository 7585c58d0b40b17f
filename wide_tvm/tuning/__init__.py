"""Tuning of the gated kernels' knobs: one MetaSchedule task per kernel and token bucket.

* `space`: the knob spaces as MetaSchedule tasks (templates, categorical decisions, the mutator);
* `runner`: what MetaSchedule's builder and runner call (the real kernel, valid masks, output checks);
* `search`: the MetaSchedule runs (wide-tune's engine);
* `database`: the JSON records and the picks the compiler applies (`load`);
* `nearest`: an untuned shape's knobs from the nearest tuned shape (the lowering and the benchmark build use it);
* `knob_file`: GPU sweep imports (kernel_knobs.json) and the record of tuning runs;
* `crossover`: the dense fallback's measured crossovers (crossover.json, `wide-tune --crossover`);
* `driver`: `wide-tune` itself (a model's kernels from the lowering's plan, or the benchmark's).
"""
