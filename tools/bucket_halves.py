"""Would timing a tile bucket at one count change its pick? The per-count times of the tile buckets' records.

    python tools/bucket_halves.py tuning_logs/cuda-sm90 [--records-of REV]

The tuning runner times each candidate of the <= 128, <= 512 and more-token buckets at the bucket's timed count
(128, 512, 4096) and at smaller counts in it (tuning/runner.py, ALSO_TIMED: 64; 256; 2048, 1536, 1024) and
ranks them by the mean over the counts of each count's median (database.record_seconds). This prints, per such
task, the pick and the best candidate at each count alone, each with its median at every count: where they agree, a
bucket split at those counts would pick the same kernel.
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
    from wide_tvm.tuning.database import count_medians, task_records, timed_counts, timed_seconds
    from wide_tvm.schedules.code_version import records_of
    from wide_tvm.tuning.runner import ALSO_TIMED
    from wide_tvm.tuning.space import is_current, knob_values, replayed

    with records_of(args.records_of) if args.records_of else contextlib.nullcontext():
        by_task = defaultdict(list)
        for task, rec in task_records(args.folder):
            secs = timed_seconds(rec)
            if task.space != "tile" or task.tokens not in ALSO_TIMED or not is_current(rec.workload.mod) or not secs:
                continue
            counts, medians = timed_counts(task), count_medians(task, secs)
            if len(medians) != len(counts):  # an older runner's record, timed at one count
                continue
            knobs = knob_values(replayed(rec.workload.mod, rec.trace))
            by_task[task.name].append(([t * 1e6 for t in medians], counts, knobs["variant"].name() if "variant" in knobs else knobs))
    if not by_task:
        sys.exit(f"{args.folder}: no current records of a tile bucket timed at several token counts "
                 f"({', '.join(map(str, ALSO_TIMED))} and smaller ones)")
    for name, rows in sorted(by_task.items()):
        print(f"{name}: {len(rows)} current records")
        counts = rows[0][1]
        for label, key in [("pick", lambda r: sum(r[0]))] + [
                (f"best at {m}", lambda r, i=i: r[0][i]) for i, m in enumerate(counts)]:
            times, _, knobs = min(rows, key=key)
            print(f"  {label:14s} {str(knobs):40s} " + "  ".join(f"{m}: {t:7.1f} us" for m, t in zip(counts, times)))


if __name__ == "__main__":
    main()
