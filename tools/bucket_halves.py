"""Would splitting a tile bucket change its pick? The per-count times of the tile buckets' records.

    python tools/bucket_halves.py tuning_logs/cuda-sm90 [--records-of REV]

The tuning runner times each candidate of the <= 128, <= 512 and more-token buckets at the bucket's timed count
(128, 512, 4096: its "top") and at half of it (schedules/knob_runner.py, ALSO_TIMED) and ranks them by the mean.
This prints, per such task, the pick (best mean), the best candidate at the top alone and the best at the half
alone, each with both times: where the three agree, a bucket split at the half would pick the same kernel.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections import defaultdict


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", help="tuning folder holding the MetaSchedule database")
    p.add_argument("--records-of", help="count records of this git revision's kernel code as current")
    args = p.parse_args()
    warnings.simplefilter("ignore")
    from wide_tvm.knob_tuning import task_records, timed_seconds
    from wide_tvm.schedules.code_version import records_of
    from wide_tvm.schedules.knob_runner import ALSO_TIMED
    from wide_tvm.schedules.knob_space import is_current, knob_values, replayed

    with records_of(args.records_of) if args.records_of else contextlib.nullcontext():
        by_task = defaultdict(list)
        for task, rec in task_records(args.folder):
            secs = timed_seconds(rec)
            if task.space != "tile" or task.tokens not in ALSO_TIMED or not is_current(rec.workload.mod) or not secs:
                continue
            half = len(secs) // 2  # the top's repeats first, then the half's (knob_runner.alloc_args)
            knobs = knob_values(replayed(rec.workload.mod, rec.trace))
            by_task[task.name].append((sum(secs[:half]) / half * 1e6, sum(secs[half:]) / half * 1e6,
                                       knobs.get("variant", knobs)))
    if not by_task:
        sys.exit(f"{args.folder}: no current records of a tile bucket timed at two token counts "
                 f"({', '.join(map(str, ALSO_TIMED))} and half of it)")
    for name, rows in sorted(by_task.items()):
        print(f"{name}: {len(rows)} current records")
        for label, key in (("pick (mean)", lambda r: r[0] + r[1]), ("best at top", lambda r: r[0]),
                           ("best at half", lambda r: r[1])):
            top, half, knobs = min(rows, key=key)
            print(f"  {label:12s} {str(knobs):40s} top {top:7.1f} us  half {half:7.1f} us")


if __name__ == "__main__":
    main()
