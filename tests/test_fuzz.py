"""Fuzz targets (issue 53): mutated ONNX and .pt2 files through the importers, and random calls of a loaded model.
Every input must import / run, or fail with one WideError: any other exception, a crash (the worker process dies)
or a hang (no answer within HANG_SECONDS) is a finding. Time-bounded, behind the `fuzz` marker (also `slow`):

    WIDE_FUZZ_SECONDS=600 python -m pytest -m fuzz tests/test_fuzz.py    # 10 minutes per target
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

BUDGET = float(os.environ.get("WIDE_FUZZ_SECONDS", "60"))
HANG_SECONDS = 120
pytestmark = [pytest.mark.fuzz, pytest.mark.slow]

# A worker that imports each file named on stdin and answers one line: ok, error (a WideError) or bug (anything else)
IMPORT_WORKER = """
import sys, warnings
warnings.simplefilter("ignore")
from wide_tvm.errors import WideError
from wide_tvm.frontends.loader import import_model
def one_line(text):
    return "".join(c if c.isprintable() else " " for c in text)[:300]
for line in sys.stdin:
    try:
        import_model(line.strip())
        print("ok", flush=True)
    except WideError as err:
        message = str(err)
        # the promise: one printable line (a crafted member name must not break it)
        print("error" if message.isprintable() else "bug multi-line WideError", one_line(message), flush=True)
    except BaseException as err:  # noqa: BLE001 - a finding
        print("bug", type(err).__name__, one_line(str(err)), flush=True)
"""


def _mutate(data: bytes, rng: np.random.Generator) -> bytes:
    buf = bytearray(data)
    for _ in range(int(rng.integers(1, 4))):
        op, pos = int(rng.integers(0, 5)), int(rng.integers(0, max(1, len(buf))))
        if op == 0:  # flip bytes
            for i in rng.integers(0, len(buf), int(rng.integers(1, 16))):
                buf[int(i)] ^= int(rng.integers(1, 256))
        elif op == 1:  # truncate
            del buf[pos:]
        elif op == 2:  # insert junk
            buf[pos:pos] = rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8).tobytes()
        elif op == 3:  # zero a range
            end = min(len(buf), pos + int(rng.integers(1, 256)))
            buf[pos:end] = bytes(end - pos)
        else:  # duplicate a range
            end = min(len(buf), pos + int(rng.integers(1, 512)))
            buf[pos:pos] = buf[pos:end]
    return bytes(buf)


class _Worker:
    def __init__(self, script: str, cwd: str):
        self.proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, cwd=cwd)

    def ask(self, line: str) -> str:
        """The worker's answer, "crash ..." where it died, "hang" where it did not answer in time."""
        import selectors

        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(HANG_SECONDS):
            self.proc.kill()
            return "hang"
        answer = self.proc.stdout.readline()
        if not answer:
            return f"crash {self.proc.wait()}"
        return answer.strip()

    def close(self):
        self.proc.kill()
        self.proc.wait()


@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
def test_fuzz_importers(exported, tmp_path, fmt):
    path, _, _ = exported("default", fmt)
    seed = int(os.environ.get("WIDE_FUZZ_SEED") or np.random.SeedSequence().entropy % 2**32)
    rng, original = np.random.default_rng(seed), open(path, "rb").read()
    worker, findings, counts, start, i = _Worker(IMPORT_WORKER, str(tmp_path)), [], {}, time.monotonic(), 0
    try:
        while time.monotonic() - start < BUDGET:
            case = tmp_path / f"case{i % 2}.{fmt}"
            case.write_bytes(_mutate(original, rng))
            answer = worker.ask(str(case))
            kind = answer.split(" ", 1)[0]
            counts[kind] = counts.get(kind, 0) + 1
            if kind not in ("ok", "error"):
                kept = tmp_path / f"finding{len(findings)}.{fmt}"
                case.rename(kept)
                findings.append((str(kept), answer))
                if kind in ("crash", "hang"):
                    worker = _Worker(IMPORT_WORKER, str(tmp_path))
            i += 1
    finally:
        worker.close()
    print(f"{fmt}: {i} mutated files in {BUDGET:.0f} s, seed {seed}: {counts}")
    assert not findings, (seed, findings[:5])


def test_fuzz_model_calls(exported, tmp_path):
    """Random inputs of random dtype, rank, shape and values to a loaded model: logits or one WideError."""
    import wide_tvm

    path, _, cfg = exported("default", "onnx")
    lib = str(tmp_path / "m.so")
    wide_tvm.compile(path, "llvm").export(lib)
    model = wide_tvm.load(lib)
    seed = int(os.environ.get("WIDE_FUZZ_SEED") or np.random.SeedSequence().entropy % 2**32)
    rng, start, n, counts = np.random.default_rng(seed), time.monotonic(), 0, {"ok": 0, "error": 0}
    dtypes = ["int64", "int32", "int16", "uint8", "uint64", "float32", "float64", "bool"]
    while time.monotonic() - start < BUDGET:
        rank = int(rng.choice([1, 2, 2, 2, 3]))
        shape = [int(rng.choice([0, 1, 1, 2, 5, 64]))] * rank
        if rank == 2:
            shape = [int(rng.choice([1, 1, 1, 2])), int(rng.choice([0, 1, 3, 17, 64]))]
        dtype = str(rng.choice(dtypes))
        hi = int(rng.choice([cfg.vocab_size, 2 * cfg.vocab_size, 2**31]))
        x = rng.integers(-hi // 4, hi, shape).astype(dtype)
        try:
            out = model(x)
            assert np.isfinite(out).all() and out.shape == (1, shape[1], cfg.vocab_size), (seed, x)
            counts["ok"] += 1
        except wide_tvm.WideError:
            counts["error"] += 1
        n += 1
    print(f"model calls: {n} in {BUDGET:.0f} s, seed {seed}: {counts}")
    assert counts["ok"] > 0 and counts["error"] > 0
