"""Where tunings live: the shipped ones (committed, package data) and the user's own (a per-user folder).

A compile applies, per target folder (`cuda-sm90`, `llvm`), the shipped tunings with the user's on top, bucket by
bucket (`merge_entries`); `wide-tune` writes into the user's folder unless given `--out`, never into the installed
package or a source checkout. Pure Python (no TVM).

    user_root()      $WIDE_TVM_TUNING_HOME, else $XDG_CACHE_HOME/wide-tvm/tuning_logs, else ~/.cache/wide-tvm/tuning_logs
    shipped_root()   the wide_tvm.tuning_logs package (the repository's tuning_logs/)
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import os
import time
from pathlib import Path

from ..errors import WideError

LOCK_FILE = ".wide-tune.lock"


def shipped_root() -> Path:
    """The committed tunings, found as the package `wide_tvm.tuning_logs` (so also after a non-editable install)."""
    return Path(importlib.import_module("wide_tvm.tuning_logs").__file__).resolve().parent


def user_root() -> Path:
    """The user's own tunings (`wide-tune` writes here by default)."""
    explicit = os.environ.get("WIDE_TVM_TUNING_HOME")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "wide-tvm" / "tuning_logs"


def has_tuning(folder: Path) -> bool:
    return (folder / "database_workload.json").exists() or (folder / "kernel_knobs.json").exists()


def default_folders(target_folder: str) -> list[str]:
    """The tuning folders a compile for this target applies by default, lowest priority first: the shipped one,
    then the user's (each only where it holds a tuning)."""
    return [str(root / target_folder) for root in (shipped_root(), user_root()) if has_tuning(root / target_folder)]


def merge_entries(base: dict, over: dict) -> dict:
    """Kernel-knob entries (tuning/database.py: load) of `base` with `over`'s on top: per kernel key and knob
    field, every token bucket `over` sets (not None) replaces base's; other fields of `over` replace base's."""
    merged = {k: dict(v) for k, v in base.items()}
    for key, entry in over.items():
        target = merged.setdefault(key, {})
        for field, value in entry.items():
            old = target.get(field)
            if isinstance(value, list) and isinstance(old, list) and len(old) == len(value):
                target[field] = [o if v is None else v for o, v in zip(old, value)]
            else:
                target[field] = value
    return merged


@contextlib.contextmanager
def folder_lock(folder: str, timeout: float | None = None, wait_note=None):
    """Within: this process alone writes FOLDER's tuning files (an flock on FOLDER/.wide-tune.lock; another tuner
    waits, after `wait_note()`), so concurrent tuners never interleave their appends. WideError after `timeout`
    seconds."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, LOCK_FILE), "a+") as handle:
        start, noted = time.monotonic(), False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if timeout is not None and time.monotonic() - start > timeout:
                    raise WideError(f"{folder}: another wide-tune is writing this tuning folder") from None
                if not noted and wait_note is not None:
                    wait_note()
                    noted = True
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
