"""Time chosen knob sets of the benchmark's kernels into a tuning database, without a search.

    python3 tools/measure_knobs.py tuning_logs/cuda-sm90 --only 'tile2$' --top 4 \
        --variant '{"kernel": "wgmma", "tokens": 128, "rows": 4, "stages": 4, "producer": 4, "tail": 8}'

For each task of the Llama-3.1-8B kernels (wide-tune --llama8b's) that --only finds: its --top K fastest records of
any kernel-code version, re-timed today, and each --variant (a tile task's `variant` knob, JSON: by field name, or the positional list of older logs) that is one of its
candidates; points already timed on today's code are skipped. The records are MetaSchedule's, timed by the runner
wide-tune uses (tuning/runner.py), so the database's picks compare them with every other record: for a
runner change (the records it stamps stale elsewhere: re-stamp the rest, re-time these) or a new candidate, where a
search would measure what is already known. Needs wide_tvm installed (pip install -e .), or on the GPU host the
package layout tools/gpu_tune.sh makes (its scratch folder on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import json
import re
import sys


def points_to_time(tasks: list, records: list, top: int, variants: list) -> list[tuple]:
    """(task, knob values) to time: per task its `top` fastest distinct records' knobs (any code version), then the
    `variants` (tile_knob entries) it has, each once."""
    from wide_tvm.knobs import tile_knob
    from wide_tvm.tuning.database import record_seconds, timed_seconds
    from wide_tvm.tuning.space import knob_values, replayed

    out = []
    for task in tasks:
        timed = sorted(((record_seconds(task, s), rec) for t, rec in records if t == task and (s := timed_seconds(rec))),
                       key=lambda tr: tr[0])
        chosen: list[dict] = []
        for _, rec in timed:
            if len(chosen) == top:
                break
            try:
                values = knob_values(replayed(rec.workload.mod, rec.trace))
            except (KeyError, IndexError):  # knobs the space has since dropped
                continue
            if values not in chosen:
                chosen.append(values)
        for entry in variants:
            try:
                v = tile_knob(entry, task.kind)
            except ValueError:  # knobs of another kernel kind (gemm_k's stream-K for a gemm_mn)
                continue
            values = {"variant": v}
            if v in task.choices().get("variant", ()) and values not in chosen:
                chosen.append(values)
        out += [(task, values) for values in chosen]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", help="the tuning database's folder (e.g. tuning_logs/cuda-sm90)")
    p.add_argument("--target", default="cuda")
    p.add_argument("--only", required=True, metavar="REGEX", help="the tasks (wide-tune --show names them)")
    p.add_argument("--top", type=int, default=0, help="re-time each task's K fastest records")
    p.add_argument("--variant", action="append", default=[], type=json.loads, metavar="JSON",
                   help="a tile `variant` to time where a task has it (repeatable)")
    args = p.parse_args(argv)

    from wide_tvm.targets import parse_target
    from wide_tvm.tuning import knob_file
    from wide_tvm.tuning.database import measured_by_task, open_database, task_records
    from wide_tvm.tuning.driver import bench_kernels, gpu_name, spec_tasks
    from wide_tvm.tuning.search import candidate_builder, candidate_runner, measure_points
    from wide_tvm.tuning.space import decisions_of, knob_key, scheduled, task_of, template

    tgt = parse_target(args.target)
    tasks = [t for t in spec_tasks(bench_kernels(tgt.kind.name), tgt) if re.search(args.only, t.name)]
    if not tasks:
        sys.exit(f"--only {args.only!r} matches no task")
    records = task_records(args.folder)
    done = measured_by_task(records)
    points = []
    for task, values in points_to_time(tasks, records, args.top, args.variant):
        mod = template(task)
        sch = scheduled(task, decisions_of(task, values), mod)
        if knob_key(sch.mod) in done.get(task, set()):
            continue
        points.append((mod, sch))
        print(f"{task.name}: {values}")
    if not points:
        print("nothing to time: every point is timed on today's kernel code")
        return 0
    command = "python3 tools/measure_knobs.py " + " ".join(argv if argv is not None else sys.argv[1:])
    names = sorted({task_of(mod).name for mod, _ in points})
    run = knob_file.record_run(args.folder, str(tgt), command, names,
                               hardware=gpu_name() if tgt.kind.name == "cuda" else None)
    measure_points(points, tgt, candidate_builder(), candidate_runner(tgt), open_database(args.folder))
    knob_file.finish_run(args.folder, run, names)
    print(f"timed {len(points)} points into {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
