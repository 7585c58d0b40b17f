"""The knob file `tuning_logs/<target>/kernel_knobs.json` (GPU sweep imports, `wide-tune --from-sweep`) and the
record of wide-tune runs beside a database (`tuning_runs.json`).

The knob file maps a kernel key (kernel_spec.kernel_key) to knobs per token bucket; the database's picks replace
them bucket by bucket (tuning/database.py: load). Kernels with neither keep their defaults.
"""

from __future__ import annotations

import datetime
import json
import os
import platform

from ..errors import WideError

FILE = "kernel_knobs.json"


def read(folder: str) -> dict:
    """The entries of FOLDER/kernel_knobs.json ({} when there is none), by kernel key (kernel_spec.kernel_key)."""
    path = os.path.join(folder, FILE)
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            return json.load(f)["entries"]
    except (OSError, ValueError, KeyError) as err:
        raise WideError(f"{path}: not a kernel knob file ({err})") from None


def host_cpu() -> str:
    """'<model name>, N cores' of this machine (for the record in a tuning file)."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


def save(folder: str, entries: dict, target: str, command: str, hardware: str | None = None) -> str:
    """Merge `entries` into FOLDER/kernel_knobs.json (existing keys are replaced), atomically."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, FILE)
    merged = read(folder)
    merged.update(entries)
    doc = {"target": target, "hardware": hardware or host_cpu(),
           "date": datetime.date.today().isoformat(), "command": command, "entries": merged}
    return _write_json(path, doc, sort_keys=True)


def _write_json(path: str, doc, **dump_args) -> str:
    """Write PATH through a temporary file and a rename: never half-written."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, **dump_args)
    os.replace(tmp, path)
    return path


RUNS = "tuning_runs.json"  # beside a MetaSchedule database: which wide-tune runs wrote it, where and how


def record_run(folder: str, target: str, command: str, tasks: list[str], hardware: str | None = None) -> int:
    """Append one wide-tune run (target, hardware, date, command, the tasks it set out to tune) to
    FOLDER/tuning_runs.json as unfinished, before it measures anything: a run stopped half way is still on record
    (its records are in the database); finish_run marks it done. Returns the run's index."""
    os.makedirs(folder, exist_ok=True)
    runs = _runs(folder)
    runs.append({"target": target, "hardware": hardware or host_cpu(), "date": datetime.date.today().isoformat(),
                 "command": command, "tasks": tasks, "finished": False})
    _write_json(os.path.join(folder, RUNS), runs)
    return len(runs) - 1


def finish_run(folder: str, index: int, tasks: list[str]) -> str:
    """Mark run `index` finished, with the tasks it actually tuned (those already tuned were skipped)."""
    runs = _runs(folder)
    runs[index].update(tasks=tasks, finished=True)
    return _write_json(os.path.join(folder, RUNS), runs)


def _runs(folder: str) -> list:
    path = os.path.join(folder, RUNS)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)
