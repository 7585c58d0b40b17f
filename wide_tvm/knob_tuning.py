"""MetaSchedule runs over the gated kernels' knob tasks (schedules.knob_space), into one JSON database.

One TuneContext per (kernel, token bucket); the evolutionary search samples and mutates the knob decisions,
LocalBuilder instantiates and compiles each candidate, LocalRunner times it on valid masks, and every record
lands in OUT/database_{workload,tuning_record}.json. Measured candidates are never measured again: a rerun
starts from the records already there, and a task with `trials` records (or its whole space) is skipped.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import warnings

import numpy as np

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms
from tvm.ir.utils import derived_object

from .schedules.knob_runner import ALSO_TIMED, alloc_args, build_candidate, run_evaluator
from .schedules.knob_space import (KnobTask, decisions_of, entry_value, incumbent, is_current, knob_key, knob_values,
                                   replayed, scheduled, space_generator, task_of, template)

WORKLOAD_FILE = "database_workload.json"
# A task with fewer trials left than this after its seeds has them drawn at random and measured in the seeds' batch:
# MetaSchedule's round-robin scheduler spends an iteration (a builder pool, nvcc, a runner call) per task and round,
# which is why `--trials 2` over the 45 CUDA tasks did not finish within a 10-minute call on the H200 while
# `--trials 1` (one batch) took 2.5 minutes; the search's first round samples at random anyway.
SEARCH_MIN = 8
RECORD_FILE = "database_tuning_record.json"


def open_database(folder: str) -> ms.database.JSONDatabase:
    os.makedirs(folder, exist_ok=True)
    return ms.database.JSONDatabase(os.path.join(folder, WORKLOAD_FILE), os.path.join(folder, RECORD_FILE),
                                    module_equality="structural")


def measured(db: ms.database.Database, mod: tvm.IRModule) -> set:
    """The knob points (knob_space.knob_key) the database holds records of for a template's task, timed on
    today's kernel code: the records of every template of the task (one made before a candidate list changed
    included), each read through its own workload."""
    return measured_by_task(_task_records(db)).get(task_of(mod), set())


def measured_by_task(records: list) -> dict[KnobTask, set]:
    """measured() for every task at once, from a database's (task, record) list (one pass)."""
    points: dict = {}
    for task, rec in records:
        if is_current(rec.workload.mod):
            points.setdefault(task, set()).add(knob_key(replayed(rec.workload.mod, rec.trace)))
    return points


@derived_object
class ProgressCallback(ms.measure_callback.PyMeasureCallback):
    """Advances one progress bar per task as its candidates come back from the runner."""

    def __init__(self, progress, bars: list):
        self.progress, self.bars = progress, bars

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        self.progress.advance(self.bars[task_id], len(runner_results))


def _builder() -> ms.builder.LocalBuilder:
    """MetaSchedule's builder for knob candidates: the real kernel of each (knob_runner.build_candidate), one build a
    core."""
    return ms.builder.LocalBuilder(f_build=build_candidate, max_workers=os.cpu_count(), timeout_sec=600)


def _runner(target: tvm.target.Target) -> ms.runner.LocalRunner:
    cpu = target.kind.name == "llvm"  # CPU: 3 x 5 runs, caches flushed per repeat; GPU: 20 calls, L2 flushed each
    config = (ms.runner.EvaluatorConfig(number=3, repeat=5, min_repeat_ms=0, enable_cpu_cache_flush=True) if cpu
              else ms.runner.EvaluatorConfig(number=1, repeat=20, min_repeat_ms=0))
    return ms.runner.LocalRunner(timeout_sec=120, evaluator_config=config, f_alloc_argument=alloc_args,
                                 f_run_evaluator=run_evaluator)


def measure_points(points: list, target, builder, runner, db) -> None:
    """Build and time given (template, schedule of it) points with MetaSchedule's builder and runner, and commit
    their records (a failed build or run as 1e10 s, as MetaSchedule records it)."""
    scheds = [sch for _, sch in points]
    args = [ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"]) for sch in scheds]
    builds = builder.build([ms.builder.BuilderInput(sch.mod, target) for sch in scheds])
    ok = [i for i, b in enumerate(builds) if b.error_msg is None]
    device = "cpu" if target.kind.name == "llvm" else target.kind.name
    futures = runner.run([ms.runner.RunnerInput(builds[i].artifact_path, device, args[i]) for i in ok])
    secs = {i: [1e10] for i in range(len(scheds))}
    for i, fut in zip(ok, futures):
        res = fut.result()
        if res.error_msg is None:
            secs[i] = [float(t) for t in res.run_secs]
    for i, (mod, sch) in enumerate(points):
        db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(mod), secs[i], target, args[i]))


def tune_tasks(tasks: list[KnobTask], target: tvm.target.Target, out: str, trials: int, force: bool,
               progress) -> list[str]:
    """Tune `tasks` with up to `trials` measured candidates each, the incumbent knobs (what the kernel runs
    without this database: the folder's knob file or the default) measured first, so that the database's pick
    is never one MetaSchedule timed slower than them; returns the names of the tasks it ran."""
    from .kernel_knobs import load

    db = open_database(out)
    file_entries = load(out, database=False)
    records = _task_records(db)  # the database read once: the stale picks and the points already measured
    stale = best_records(out, records, current=False)
    timed = measured_by_task(records)
    todo, seeds = [], []
    for task in tasks:
        mod = template(task)
        done = timed.get(task, set())
        want = min(trials, task.size() - len(done)) if force else min(trials, task.size()) - len(done)
        if want <= 0:
            progress.console.print(f"{task.name}: already tuned ({len(done)} of {task.size()} candidates "
                                   "measured), skipped")
            continue
        firsts = [incumbent(task, file_entries.get(task.key))]
        if task in stale:  # the fastest knobs timed on older kernel code: re-measured, not trusted
            firsts.append(decisions_of(task, stale[task][1]))
        points, want, done = _first_points(task, mod, firsts, want, done)
        seeds += [(task, mod, sch) for sch in points]
        todo.append((task, mod, want, done))
    if not todo:
        return []
    builder = _builder()
    runner = _runner(target)
    bars = [progress.add_task(task.name, total=want + sum(s[0] == task for s in seeds)) for task, _, want, _ in todo]
    if seeds:
        measure_points([(mod, sch) for _, mod, sch in seeds], target, builder, runner, db)
        for bar, (task, *_) in zip(bars, todo):
            progress.advance(bar, sum(s[0] == task for s in seeds))
    searched = [(i, t) for i, t in enumerate(todo) if t[2] > 0]
    if searched:
        _search(searched, progress, bars, target, builder, runner, db)
    return [t[0].name for t in todo]


def _first_points(task: KnobTask, mod: tvm.IRModule, firsts: list, want: int, done: set) -> tuple[list, int, set]:
    """The points measured in one batch before any search: the given decisions (incumbent, stale best) not
    measured yet, then, when fewer than SEARCH_MIN trials are left, those at random. Returns (schedules, trials
    left for the search, measured keys with them)."""
    points = []
    for first in firsts:
        if first is None or want <= 0:
            continue
        sch = scheduled(task, first, mod)
        key = knob_key(sch.mod)
        if key not in done:
            points.append(sch)
            done = done | {key}
            want -= 1
    if 0 < want < SEARCH_MIN:
        drawn, done = random_points(task, mod, want, done, np.random.default_rng(len(done)))
        points += drawn
        want = 0
    return points, want, done


def random_points(task: KnobTask, mod: tvm.IRModule, count: int, done: set, rng) -> tuple[list, set]:
    """Up to `count` random points of a task's space whose knob_key is not in `done` (and `done` with them)."""
    points = []
    for _ in range(50 * count):
        if len(points) == count:
            break
        sch = scheduled(task, {name: int(rng.integers(len(c))) for name, c in task.choices().items()}, mod)
        key = knob_key(sch.mod)
        if key not in done:
            done = done | {key}
            points.append(sch)
    return points, done


def _search(todo: list, progress, bars: list, target, builder, runner, db) -> None:
    """MetaSchedule's task scheduler over the tasks (index, (task, template, trials, measured points))."""
    todo_bars = [bars[i] for i, _ in todo]
    todo = [t for _, t in todo]
    contexts = [ms.TuneContext(mod, target=target, space_generator=space_generator(done),
                               search_strategy=ms.search_strategy.EvolutionarySearch(
                                   population_size=64, init_measured_ratio=0.0, genetic_num_iters=2),
                               task_name=task.name, rand_state=i + 1, num_threads=1)
                for i, (task, mod, _, done) in enumerate(todo)]
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="wide-tune-") as logs:
        ms.tune.tune_tasks(
            tasks=contexts, task_weights=[1.0] * len(todo), work_dir=logs,
            max_trials_global=sum(t[2] for t in todo), max_trials_per_task=max(t[2] for t in todo),
            num_trials_per_iter=min(max(8, os.cpu_count() or 1), max(t[2] for t in todo)),  # a build per core
            builder=builder, runner=runner, database=db, cost_model="random",
            measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"),
                               ProgressCallback(progress, todo_bars)],
            task_scheduler="round-robin")


def task_records(folder: str) -> list:
    """(task, record) for every record of a knob task in FOLDER's database (none without a database)."""
    if not os.path.exists(os.path.join(folder, RECORD_FILE)):
        return []
    return _task_records(open_database(folder))


def record_key(rec) -> str:
    """A record's identity that survives records being added to the database (its index in task_records' order
    does not: appended records can re-order it): its workload's structural hash and its JSON (trace, run times)."""
    body = f"{tvm_ffi.structural_hash(rec.workload.mod)}|{rec.as_json()}"
    return hashlib.sha1(body.encode()).hexdigest()


def copy_records(src: str, dst: str, only: str = "") -> tuple[int, int]:
    """Append SRC's knob records (those of the tasks whose name `only` finds) to DST's database, creating it;
    records DST already holds (record_key) are skipped. Returns (added, skipped)."""
    db = open_database(dst)
    have = {record_key(rec) for _, rec in _task_records(db)}
    added = skipped = 0
    for task, rec in task_records(src):
        if not re.search(only, task.name):
            continue
        key = record_key(rec)
        if key in have:
            skipped += 1
            continue
        _commit(db, rec.workload.mod, rec)
        have.add(key)
        added += 1
    return added, skipped


def _commit(db: ms.database.Database, mod: tvm.IRModule, rec) -> None:
    """Commit a copy of tuning record `rec` to `db` under workload module `mod` (its own, or a re-stamped one)."""
    db.commit_tuning_record(ms.database.TuningRecord(rec.trace, db.commit_workload(mod), rec.run_secs, rec.target,
                                                     rec.args_info))


def _task_records(db: ms.database.Database) -> list:
    records = [(task_of(rec.workload.mod), rec) for rec in db.get_all_tuning_records()]
    return [(task, rec) for task, rec in records if task is not None]  # not other workloads


def timed_seconds(rec) -> list[float]:
    """A record's measured run times in seconds; empty for a failed build or run (MetaSchedule's 1e10 marks)."""
    secs = [float(s) for s in rec.run_secs or []]
    return secs if secs and max(secs) < 1e9 else []


def timed_counts(task: KnobTask) -> tuple[int, ...]:
    """The token counts a task's candidates are timed at, in the order of their samples (knob_runner.alloc_args)."""
    return (task.tokens, *ALSO_TIMED.get(task.tokens, ()))


def count_medians(task: KnobTask, secs: list[float]) -> list[float]:
    """A record's median sample at each of its timed token counts (timed_counts' order); one median of all its
    samples where they do not split evenly over the counts (records of an older runner)."""
    counts = len(timed_counts(task))
    if len(secs) % counts:
        counts = 1
    each = len(secs) // counts
    return [float(np.median(secs[i * each:(i + 1) * each])) for i in range(counts)]


def record_seconds(task: KnobTask, secs: list[float]) -> float:
    """A record's time: the mean over its timed token counts of each count's median sample (count_medians). A mean
    of the samples let one cold sample decide a pick (O's <= 128-token bucket: a 184 us first sample among 19-27 us
    ones moved the pick to a kernel 6.5 % slower by every median; docs/performance.md); a median per count cannot
    be moved by one."""
    medians = count_medians(task, secs)
    return sum(medians) / len(medians)


def best_records(folder: str, records: list | None = None, current: bool = True) -> dict[KnobTask, tuple[float, dict]]:
    """Per knob task in FOLDER's database (or `records`, task_records' list): (seconds, knob values) of its
    fastest record (record_seconds) timed on today's kernel code (`current`), or of its fastest stale one
    (`current=False`: knob values it no longer has are left out)."""
    best = {}
    for task, rec in task_records(folder) if records is None else records:
        if is_current(rec.workload.mod) != current:
            continue
        secs = timed_seconds(rec)
        if not secs:
            continue
        time = record_seconds(task, secs)
        if task not in best or time < best[task][0]:
            best[task] = (time, rec)
    out = {}
    for task, (time, rec) in best.items():
        try:
            out[task] = (time, knob_values(replayed(rec.workload.mod, rec.trace)))
        except (KeyError, IndexError):  # a stale record of knobs the space has since dropped
            continue
    return out


def database_entries(folder: str, entries: dict) -> dict:
    """`entries` (kernel-knob entries) with every bucket the database tuned replaced by its fastest record;
    buckets it did not tune keep the entry's knobs, or None (the kernel's default). Buckets whose every record
    was timed on older kernel code get a StaleTuningWarning: after a kernel edit they silently lost their picks."""
    from .kernel_knobs import StaleTuningWarning
    from .schedules.knob_space import ENTRY_FIELD, SPACE_TOKENS

    records = task_records(folder)
    current = {task for task, rec in records if is_current(rec.workload.mod)}
    stale_only = sorted(task.name for task in {task for task, _ in records} - current)
    if stale_only:
        warnings.warn(f"{folder}: {len(stale_only)} tuned kernel bucket(s) have only records timed on older kernel "
                      f"code ({', '.join(stale_only[:4])}{', ...' if len(stale_only) > 4 else ''}); they get the "
                      "knob file's or the default knobs. tools/restamp_records.py re-stamps records whose kernels "
                      "an edit left as they were; wide-tune re-measures the others", StaleTuningWarning, stacklevel=3)
    merged = {k: dict(v) for k, v in entries.items()}
    for task, (secs, values) in sorted(best_records(folder, records).items(), key=lambda kv: kv[0].name):
        field, n = ENTRY_FIELD[task.space], len(SPACE_TOKENS[task.space])
        entry = merged.setdefault(task.key, {})
        old = entry.get(field)
        picks = list(old) if isinstance(old, list) else [old] * n  # one knob set for every bucket, or none
        picks += [None] * (n - len(picks))
        picks[task.bucket] = entry_value(task, values)
        entry[field] = picks
        entry.setdefault("database_us", {})[f"{task.space}{task.bucket}"] = round(secs * 1e6, 2)
    return merged


def summary(folder: str) -> str:
    """Markdown table of a database: per task, candidates measured and the fastest one's knobs and time."""
    if not os.path.exists(os.path.join(folder, RECORD_FILE)):
        return f"{folder}: no MetaSchedule database"
    records = task_records(folder)
    counts: dict = {}
    for task, rec in records:
        counts.setdefault(task, [0, 0])[not is_current(rec.workload.mod)] += 1
    best = best_records(folder, records)
    lines = ["| task | tokens | measured / space | fastest (us) | knobs |", "| --- | ---: | ---: | ---: | --- |"]
    for task in sorted(counts, key=lambda t: t.name):
        us, values = best.get(task, (float("nan"), {}))
        knobs = values.get("variant", values)
        lines.append(f"| {task.name} | {task.tokens} | {counts[task][0]} / {task.size()} | {us * 1e6:.1f} | {knobs} |")
    stale = sum(c[1] for c in counts.values())
    if stale:
        lines.append(f"\n{stale} records were timed on older kernel code: not applied; wide-tune re-measures "
                     "each task's fastest of them first")
    return "\n".join(lines)


def prune(folder: str) -> tuple[int, int]:
    """Drop the records timed on older kernel code from FOLDER's database (rewritten atomically); returns
    (records kept, records dropped)."""
    from .errors import WideError

    if not os.path.exists(os.path.join(folder, RECORD_FILE)):
        raise WideError(f"{folder}: no MetaSchedule database to prune")
    records = task_records(folder)
    keep = [(rec.workload.mod, rec) for _, rec in records if is_current(rec.workload.mod)]
    rewrite_database(folder, keep)
    return len(keep), len(records) - len(keep)


def rewrite_database(folder: str, records: list) -> None:
    """Replace FOLDER's database, atomically, by `records`: (workload module, tuning record) pairs, each record
    committed under its given module (prune keeps some; tools/restamp_records.py also re-stamps modules)."""
    with tempfile.TemporaryDirectory(prefix="wide-rewrite-", dir=folder) as tmp:
        fresh = open_database(tmp)
        for mod, rec in records:
            _commit(fresh, mod, rec)
        del fresh
        for name in (WORKLOAD_FILE, RECORD_FILE):
            os.replace(os.path.join(tmp, name), os.path.join(folder, name))
