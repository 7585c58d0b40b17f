"""The deployable output: `NAME.so` (TVM library) plus `NAME.weights.npz` (weights and metadata).

Both are written to temporary names first and renamed at the end, so a failed compile leaves no
partial output file behind: also on SIGINT / SIGTERM, and after a SIGKILL the next write into that folder removes
the temporary files of processes that no longer run. `check_output` refuses a path that cannot take them before
anything is built.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import tempfile
import threading
import zipfile
from contextlib import contextmanager

import numpy as np

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # a runtime-only install without it: it has no bf16 arrays to save, and loads refuse them
    BF16 = None
META_KEY = "__wide_meta__"
# Metadata format of NAME.weights.npz: 2 binds the weights to their library (`library_sha256`); load refuses others
FORMAT = 2


def weights_path(lib_path: str) -> str:
    root, _ = os.path.splitext(lib_path)
    return root + ".weights.npz"


def check_output(lib_path: str, sources: tuple = ()) -> None:
    """WideError unless LIB_PATH and its weights file can be written: neither is a folder or one of `sources` (the
    model being compiled), and the nearest existing folder above them is a folder this process may write in."""
    from .errors import WideError

    outs = [os.path.abspath(lib_path), os.path.abspath(weights_path(lib_path))]
    for out in outs:
        if os.path.isdir(out):
            raise WideError(f"{lib_path}: {out} is a folder; give the library a file name (NAME.so)")
        for src in sources:
            if isinstance(src, (str, os.PathLike)) and (os.path.abspath(src) == out or (
                    os.path.exists(out) and os.path.exists(src) and os.path.samefile(src, out))):
                raise WideError(f"{lib_path}: would overwrite the model file {src}")
    parent = os.path.dirname(outs[0])
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise WideError(f"{lib_path}: {parent} is a file, not a folder")
    try:  # a real write: permissions alone do not tell (root passes them; a read-only mount or /proc does not take one)
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as err:
        raise WideError(f"{lib_path}: cannot write in {parent} ({err.strerror or err})") from None


_TMP = re.compile(r"\..+\.(\d+)\.tmp\.(so|npz)")


def remove_stale_temporaries(folder: str) -> list[str]:
    """Remove the temporary outputs (atomic_outputs) of processes that no longer run; returns their names."""
    removed = []
    for name in os.listdir(folder):
        m = _TMP.fullmatch(name)
        if not m or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue  # that process still runs (or is not ours to signal): its files stay
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            os.remove(os.path.join(folder, name))
            removed.append(name)
        except OSError:
            pass
    return removed


def _exit_on_term(signum, _frame):
    raise SystemExit(128 + signum)


@contextmanager
def _terminate_as_exit():
    """Within: SIGTERM raises SystemExit (as SIGINT raises KeyboardInterrupt), so cleanups run (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _exit_on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def atomic_outputs(lib_path: str):
    """Yields (tmp_lib, tmp_weights); renames them onto the real names only if the body succeeds."""
    out_dir = os.path.dirname(os.path.abspath(lib_path))
    os.makedirs(out_dir, exist_ok=True)
    remove_stale_temporaries(out_dir)
    tmp_lib = os.path.join(out_dir, f".{os.path.basename(lib_path)}.{os.getpid()}.tmp.so")
    tmp_w = os.path.join(out_dir, f".{os.path.basename(lib_path)}.{os.getpid()}.tmp.npz")
    try:
        with _terminate_as_exit():
            yield tmp_lib, tmp_w
            os.replace(tmp_w, weights_path(lib_path))
            os.replace(tmp_lib, lib_path)
    finally:
        for tmp in (tmp_lib, tmp_w):
            if os.path.exists(tmp):
                os.remove(tmp)


def save_weights(path: str, weights: list[np.ndarray], meta: dict) -> None:
    """Weights as w0, w1, ... plus the metadata; bf16 arrays (ml_dtypes, which .npz cannot name: they would load
    back as raw `|V2` bytes) stored as their uint16 bits, their dtype named in the metadata."""
    arrays = {f"w{i}": np.ascontiguousarray(w).view(np.uint16) if w.dtype == BF16 else np.ascontiguousarray(w)
              for i, w in enumerate(weights)}
    meta = meta | {"bf16_weights": [i for i, w in enumerate(weights) if w.dtype == BF16]}
    arrays[META_KEY] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_meta(path: str) -> dict:
    """The metadata of a weights file, checked to be wide-compile's current format; WideError otherwise (a
    corrupt or foreign file is never unpickled: np.load with allow_pickle off)."""
    from .errors import WideError

    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(bytes(data[META_KEY]).decode())
    except (OSError, ValueError, KeyError, EOFError, UnicodeDecodeError, zipfile.BadZipFile) as err:
        raise WideError(f"{path}: not a weights file written by wide-compile ({type(err).__name__}: "
                        f"{str(err).splitlines()[0] if str(err) else 'unreadable'})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or "library_sha256" not in meta:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise WideError(f"{path}: weights metadata format {found!r}, this wide_tvm reads {FORMAT}; re-compile the "
                        "model with this version")
    return meta


def load_weights(path: str) -> tuple[list[np.ndarray], dict]:
    """(weights, metadata) of a weights file (read_meta's checks first); WideError for a damaged one."""
    from .errors import WideError

    meta = read_meta(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            weights = [data[f"w{i}"] for i in range(len(meta["weight_names"]))]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        raise WideError(f"{path}: damaged weights file ({type(err).__name__}: {str(err).splitlines()[0]})") from None
    if meta.get("bf16_weights") and BF16 is None:
        raise WideError(f"{path}: holds bf16 weights; loading them needs the ml_dtypes package (pip install ml_dtypes)")
    for i in meta.get("bf16_weights", []):
        weights[i] = weights[i].view(BF16)
    return weights, meta
