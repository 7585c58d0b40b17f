"""MetaSchedule runs over the gated kernels' knob tasks (tuning/space.py), into one JSON database (tuning/database.py).

One TuneContext per (kernel, token bucket); the evolutionary search samples and mutates the knob decisions,
LocalBuilder instantiates and compiles each candidate, LocalRunner times it on valid masks, and every record
lands in OUT/database_{workload,tuning_record}.json. Measured candidates are never measured again: a rerun
starts from the records already there, and a task with `trials` records (or its whole space) is skipped.
"""

from __future__ import annotations

import logging
import os
import tempfile

import numpy as np
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from .database import best_records, load, measured_by_task, open_database, records_of_db
from .runner import alloc_args, build_candidate, run_evaluator
from .space import KnobTask, decisions_of, incumbent, knob_key, scheduled, space_generator, template

# A task with fewer trials left than this after its seeds has them drawn at random and measured in the seeds' batch:
# MetaSchedule's round-robin scheduler spends an iteration (a builder pool, nvcc, a runner call) per task and round,
# which is why `--trials 2` over the 45 CUDA tasks did not finish within a 10-minute call on the H200 while
# `--trials 1` (one batch) took 2.5 minutes; the search's first round samples at random anyway.
SEARCH_MIN = 8


@derived_object
class ProgressCallback(ms.measure_callback.PyMeasureCallback):
    """Advances one progress bar per task as its candidates come back from the runner."""

    def __init__(self, progress, bars: list):
        self.progress, self.bars = progress, bars

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        self.progress.advance(self.bars[task_id], len(runner_results))


def candidate_builder() -> ms.builder.LocalBuilder:
    """MetaSchedule's builder for knob candidates: the real kernel of each (runner.build_candidate), one build a
    core."""
    return ms.builder.LocalBuilder(f_build=build_candidate, max_workers=os.cpu_count(), timeout_sec=600)


def candidate_runner(target: tvm.target.Target) -> ms.runner.LocalRunner:
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
    db = open_database(out)
    file_entries = load(out, database=False)
    records = records_of_db(db)  # the database read once: the stale picks and the points already measured
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
    builder = candidate_builder()
    runner = candidate_runner(target)
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

