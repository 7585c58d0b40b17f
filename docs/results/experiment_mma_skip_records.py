"""The mma_skip candidates' runner timings (tools/measure_knobs.py on an H100, sixteenth session) next to each
gemm_mn tile task's pick in the committed database (H200 timings): not comparable across the two GPUs, which is
why those records were not merged (docs/performance.md, sixteenth session).

    python docs/results/experiment_mma_skip_records.py H100_DB_FOLDER > docs/results/mma_skip_records_h100.txt
"""
import json
import re
import sys

from wide_tvm.knob_tuning import record_seconds, task_records, timed_seconds
from wide_tvm.schedules.knob_space import knob_values, replayed
from wide_tvm.targets import parse_target
from wide_tvm.tune import bench_kernels, spec_tasks


def timed(folder, names):
    out = {}
    for t, r in task_records(folder):
        if t.name in names and (s := timed_seconds(r)):
            key = json.dumps(r.as_json(), sort_keys=True, default=str)
            out[key] = (t.name, record_seconds(t, s) * 1e6, knob_values(replayed(r.workload.mod, r.trace))["variant"])
    return out


names = {t.name for t in spec_tasks(bench_kernels("cuda"), parse_target("cuda")) if re.search("^gemm_mn.*/tile", t.name)}
committed = timed("tuning_logs/cuda-sm90", names)
h100 = {k: v for k, v in timed(sys.argv[1], names).items() if k not in committed}
print("task | committed pick (H200 us, knobs) | mma_skip candidate (H100 us, knobs)")
for name in sorted(names):
    pick = min((v for v in committed.values() if v[0] == name), key=lambda v: v[1])
    for _, us, v in sorted((v for v in h100.values() if v[0] == name), key=lambda v: v[1]):
        print(f"{name} | {pick[1]:.1f} {pick[2]} | {us:.1f} {v}")
