"""Which database picks a robust statistic would change: per task, the fastest current record by the mean of its
samples (what wide-compile picks) against the fastest by the mean over its timed token counts of each count's median
(a cold first sample cannot move it). CPU only: reads tuning_logs/cuda-sm90.

    python docs/results/experiment_rank_by_median.py
"""
import numpy as np

from wide_tvm.knob_tuning import is_current, task_records, timed_seconds
from wide_tvm.schedules.knob_space import knob_values, replayed


def per_count_median(secs: list[float]) -> float:
    """Mean over the record's timed counts (1, 2 or 4 runs of equal length) of each count's median."""
    k = 4 if len(secs) == 80 else 2 if len(secs) == 40 else 1
    n = len(secs) // k
    return sum(float(np.median(secs[i * n:(i + 1) * n])) for i in range(k)) / k


by_mean, by_median = {}, {}
for task, rec in task_records("tuning_logs/cuda-sm90"):
    secs = timed_seconds(rec)
    if not secs or not is_current(rec.workload.mod):
        continue
    for best, value in ((by_mean, sum(secs) / len(secs)), (by_median, per_count_median(secs))):
        if task not in best or value < best[task][0]:
            best[task] = (value, rec)
changed = 0
for task, (_, a) in sorted(by_mean.items(), key=lambda kv: kv[0].name):
    b = by_median[task][1]
    if a is b:
        continue
    changed += 1
    va, vb = (knob_values(replayed(r.workload.mod, r.trace)) for r in (a, b))
    print(f"{task.name}: mean pick {va} (its median {per_count_median(timed_seconds(a)) * 1e6:.2f} us) | median pick "
          f"{vb} ({by_median[task][0] * 1e6:.2f} us)")
print(f"{changed} of {len(by_mean)} tasks would change")
