"""The tuning database: MetaSchedule JSON records of the gated kernels' knob tasks, read into knob picks.

`load(folder)` is what the compiler applies: the knob file's entries (GPU sweep imports, tuning/knob_file.py) with
every token bucket the database tuned replaced by its fastest current record. A record's time is the mean over its
timed token counts of each count's median sample (record_seconds); records timed on other kernel code are not
applied (tuning/space.py: is_current) and `prune` drops them.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import warnings

import numpy as np
import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

from ..errors import WideError
from . import knob_file
from .runner import ALSO_TIMED
from .space import ENTRY_FIELD, SPACE_TOKENS, KnobTask, entry_value, is_current, knob_values, replayed, task_of

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"


class TornRecordWarning(UserWarning):
    """A database line was cut short (a tuner killed mid-append): it is skipped (readable_folder) or dropped (repair)."""


def _clean_lines(folder: str) -> tuple[list[str], list[str], int]:
    """(workload lines, record lines, lines left out) of FOLDER's database without what a kill mid-append leaves: an
    unterminated, unreadable last line of either file, and records of a workload that is not there. WideError for
    any other unreadable line (damage, not a torn append)."""
    import json

    def lines(name):
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            return [], 0
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        out = [ln for ln in text.split("\n") if ln.strip()]
        for i, line in enumerate(out):
            try:
                json.loads(line)
            except ValueError:
                if i == len(out) - 1 and not text.endswith("\n"):
                    return out[:-1], 1  # the torn last append
                raise WideError(f"{folder}: {name} line {i + 1} is unreadable (damaged, not a torn last line)") \
                    from None
        return out, 0

    (workloads, torn_w), (records, torn_r) = lines(WORKLOAD_FILE), lines(RECORD_FILE)
    kept = [ln for ln in records if isinstance(json.loads(ln), list) and json.loads(ln)
            and isinstance(json.loads(ln)[0], int) and json.loads(ln)[0] < len(workloads)]
    return workloads, kept, torn_w + torn_r + len(records) - len(kept)


def _write_lines(folder: str, workloads: list[str], records: list[str]) -> None:
    for name, lines in ((WORKLOAD_FILE, workloads), (RECORD_FILE, records)):
        tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("".join(ln + "\n" for ln in lines))
        os.replace(tmp, os.path.join(folder, name))


def readable_folder(folder: str) -> str:
    """FOLDER, or where it has torn lines (TornRecordWarning, once), a cleaned copy in a temporary folder (FOLDER is
    not written: it may be the installed package's, or another tuner's)."""
    workloads, records, dropped = _clean_lines(folder)
    if not dropped:
        return folder
    warnings.warn(f"{folder}: skipped {dropped} torn database line(s) (a tuner killed mid-write?); the next wide-tune "
                  "into the folder drops them", TornRecordWarning, stacklevel=3)
    copy = tempfile.mkdtemp(prefix="wide-db-")
    _write_lines(copy, workloads, records)
    return copy


def repair(folder: str) -> int:
    """Drop FOLDER's torn database lines in place (call under tuning.folders.folder_lock); returns how many."""
    workloads, records, dropped = _clean_lines(folder)
    if dropped:
        warnings.warn(f"{folder}: dropped {dropped} torn database line(s) (a tuner killed mid-write?)",
                      TornRecordWarning, stacklevel=2)
        _write_lines(folder, workloads, records)
    return dropped


class StaleTuningWarning(UserWarning):
    """Some tuned buckets have only records timed on older kernel code: they run the knob file's or default knobs."""


def open_database(folder: str) -> ms.database.JSONDatabase:
    os.makedirs(folder, exist_ok=True)
    return ms.database.JSONDatabase(os.path.join(folder, WORKLOAD_FILE), os.path.join(folder, RECORD_FILE),
                                    module_equality="structural")


def load(folder: str | None, database: bool = True) -> dict:
    """The knob entries of a tuning folder ({} when it has none): its kernel_knobs.json (GPU sweep imports),
    with every token bucket its MetaSchedule database tuned replaced by the database's fastest record (unless
    `database` is False)."""
    if not folder:
        return {}
    entries = knob_file.read(folder)
    if database and os.path.exists(os.path.join(folder, RECORD_FILE)):
        try:
            entries = database_entries(folder, entries)
        except Warning:  # a StaleTuningWarning that `-W error` raised: it names its buckets, keep it as it is
            raise
        except Exception as err:  # noqa: BLE001 - a damaged database names its folder, not a TVM traceback
            raise WideError(f"{folder}: unreadable MetaSchedule database ({str(err).splitlines()[-1]})") from None
    return entries


def measured(db: ms.database.Database, mod: tvm.IRModule) -> set:
    """The knob points the database holds current records of for a template's task (measured_by_task)."""
    return measured_by_task(records_of_db(db)).get(task_of(mod), set())


def measured_by_task(records: list) -> dict[KnobTask, set]:
    """The knob points (space.knob_key) each task has records of, timed on today's kernel code, from a database's
    (task, record) list (one pass): the records of every template of the task (one made before a candidate list
    changed included), each read through its own workload."""
    from .space import knob_key

    points: dict = {}
    for task, rec in records:
        if is_current(rec.workload.mod):
            points.setdefault(task, set()).add(knob_key(replayed(rec.workload.mod, rec.trace)))
    return points


def task_records(folder: str) -> list:
    """(task, record) for every record of a knob task in FOLDER's database (none without a database)."""
    if not os.path.exists(os.path.join(folder, RECORD_FILE)):
        return []
    return records_of_db(open_database(readable_folder(folder)))


def has_other_records(folder: str) -> bool:
    """Whether FOLDER's database holds records of workloads other than knob tasks (TVM's own schedules, which
    MetaScheduleApplyDatabase applies to the dense kernels); the knob tasks' are read by `load` instead."""
    if not os.path.exists(os.path.join(folder, RECORD_FILE)):
        return False
    return any(task_of(rec.workload.mod) is None
               for rec in open_database(readable_folder(folder)).get_all_tuning_records())


def record_key(rec) -> str:
    """A record's identity that survives records being added to the database (its index in task_records' order
    does not: appended records can re-order it): its workload's structural hash and its JSON (trace, run times)."""
    body = f"{tvm_ffi.structural_hash(rec.workload.mod)}|{rec.as_json()}"
    return hashlib.sha1(body.encode()).hexdigest()


def copy_records(src: str, dst: str, only: str = "") -> tuple[int, int]:
    """Append SRC's knob records (those of the tasks whose name `only` finds) to DST's database, creating it;
    records DST already holds (record_key) are skipped. Returns (added, skipped)."""
    from .folders import folder_lock

    with folder_lock(dst):
        repair(dst)
        return _copy_records(src, dst, only)


def _copy_records(src: str, dst: str, only: str) -> tuple[int, int]:
    db = open_database(dst)
    have = {record_key(rec) for _, rec in records_of_db(db)}
    added = skipped = 0
    for task, rec in task_records(src):
        if not re.search(only, task.name):
            continue
        key = record_key(rec)
        if key in have:
            skipped += 1
            continue
        commit(db, rec.workload.mod, rec)
        have.add(key)
        added += 1
    return added, skipped


def commit(db: ms.database.Database, mod: tvm.IRModule, rec) -> None:
    """Commit a copy of tuning record `rec` to `db` under workload module `mod` (its own, or a re-stamped one)."""
    db.commit_tuning_record(ms.database.TuningRecord(rec.trace, db.commit_workload(mod), rec.run_secs, rec.target,
                                                     rec.args_info))


def records_of_db(db: ms.database.Database) -> list:
    records = [(task_of(rec.workload.mod), rec) for rec in db.get_all_tuning_records()]
    return [(task, rec) for task, rec in records if task is not None]  # not other workloads


def timed_seconds(rec) -> list[float]:
    """A record's measured run times in seconds; empty for a failed build or run (MetaSchedule's 1e10 marks)."""
    secs = [float(s) for s in rec.run_secs or []]
    return secs if secs and max(secs) < 1e9 else []


def timed_counts(task: KnobTask) -> tuple[int, ...]:
    """The token counts a task's candidates are timed at, in the order of their samples (runner.alloc_args)."""
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
        knobs = values["variant"].name() if "variant" in values else values
        lines.append(f"| {task.name} | {task.tokens} | {counts[task][0]} / {task.size()} | {us * 1e6:.1f} | {knobs} |")
    stale = sum(c[1] for c in counts.values())
    if stale:
        lines.append(f"\n{stale} records were timed on older kernel code: not applied; wide-tune re-measures "
                     "each task's fastest of them first")
    return "\n".join(lines)


def prune(folder: str) -> tuple[int, int]:
    """Drop the records timed on older kernel code from FOLDER's database (rewritten atomically); returns
    (records kept, records dropped)."""
    if not os.path.exists(os.path.join(folder, RECORD_FILE)):
        raise WideError(f"{folder}: no MetaSchedule database to prune")
    from .folders import folder_lock

    with folder_lock(folder):
        repair(folder)
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
            commit(fresh, mod, rec)
        del fresh
        for name in (WORKLOAD_FILE, RECORD_FILE):
            os.replace(os.path.join(tmp, name), os.path.join(folder, name))
