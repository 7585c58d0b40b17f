"""Bad inputs and faults (issue 53): checked token ids, a model shared between threads, output paths that cannot
take a library, temporary files after a signal. Each is one clear error (WideError / exit 2) and leaves nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

import wide_tvm
from wide_tvm.cli import compile_main


@pytest.fixture(scope="module")
def library(exported, tmp_path_factory):
    """(loaded CPU model, its path, the PyTorch model) of the default tiny example."""
    path, model, cfg = exported("default", "onnx")
    lib = str(tmp_path_factory.mktemp("lib") / "m.so")
    wide_tvm.compile(path, "llvm").export(lib)
    return wide_tvm.load(lib), lib, model, cfg


def test_token_ids_are_checked(library):
    runner, _, model, cfg = library
    ids = np.array([[1, 5, 7, 200]], dtype=np.int64)
    want = runner(ids)
    assert np.array_equal(runner(ids.astype(np.int32)), want)  # int32 ids widened to the library's int64
    assert np.array_equal(runner(torch.from_numpy(ids).to(torch.int32)).numpy(), want)
    v = cfg.vocab_size
    for bad, match in ((np.array([[1, v]]), f"id {v} is outside \\[0, {v}\\)"),
                       (np.array([[-1, 2]]), "id -1 is outside"),
                       (np.array([[10**9]]), "id 1000000000 is outside"),
                       (np.array([[-100000]]), "id -100000 is outside"),
                       (ids.astype(np.float32), "dtype float32; the model takes integers"),
                       (ids[0], "shape \\[4\\], the model takes \\[1, T\\]"),
                       (ids[None], "shape \\[1, 1, 4\\]"),
                       (np.zeros((1, 0), dtype=np.int64), "holds no tokens"),
                       (np.ones((2, 3), dtype=np.int64), "shape \\[2, 3\\], the model takes \\[1, T\\]")):
        with pytest.raises(wide_tvm.WideError, match=match):
            runner(bad)
    with torch.no_grad():
        np.testing.assert_allclose(want, model(torch.from_numpy(ids)).numpy(), rtol=1e-4, atol=1e-4)


def test_the_library_never_reads_past_the_vocabulary(library):
    """A caller that bypasses the wrapper's check (the VM called directly) gets the table's last row for an id past
    it, not a read out of bounds: the embedding's take runs in clip mode (passes/legalize.py)."""
    import tvm

    runner, _, _, cfg = library
    far = tvm.runtime.tensor(np.array([[3, 10**9]], dtype=np.int64), runner.device)
    last = tvm.runtime.tensor(np.array([[3, cfg.vocab_size - 1]], dtype=np.int64), runner.device)
    out = runner.vm["main"](far, *runner.weights).numpy()
    assert np.isfinite(out).all() and np.array_equal(out, runner.vm["main"](last, *runner.weights).numpy())


def test_one_model_shared_by_threads(library):
    """Eight threads calling one loaded model with mixed lengths get what one thread gets (each thread runs its own
    virtual machine over the shared library and weights)."""
    runner = library[0]
    rng = np.random.default_rng(0)
    cases = [rng.integers(0, 256, (1, int(t))) for t in rng.integers(1, 24, 16)]
    want = [runner(ids) for ids in cases]
    errors, done = [], []

    def work(k: int):
        try:
            for i in range(24):
                j = (k * 7 + i) % len(cases)
                if not np.array_equal(runner(cases[j]), want[j]):
                    errors.append((k, j))
            done.append(k)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and sorted(done) == list(range(8))


def test_output_paths_that_cannot_take_a_library(exported, tmp_path, capsys):
    """-o an existing folder, under a file, or the model file itself: one line, exit 2, before anything is built,
    and nothing written."""
    path, _, _ = exported("default", "onnx")
    (tmp_path / "dir.so").mkdir()
    (tmp_path / "file").write_text("x")
    before = sorted(os.listdir(tmp_path))
    for out, match in ((tmp_path / "dir.so", "is a folder"), (tmp_path / "file" / "m.so", "is a file, not a folder"),
                       (path, "would overwrite the model file")):
        assert compile_main([path, "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and match in err, err
    assert sorted(os.listdir(tmp_path)) == before


def test_temporaries_go_on_sigterm_and_after_a_kill(tmp_path):
    """A SIGTERM while the library is being written removes its temporary files; those a killed process left are
    removed by the next write into the folder."""
    script = (f"import os, signal, time\nfrom wide_tvm.artifact import atomic_outputs\n"
              f"with atomic_outputs({str(tmp_path / 'm.so')!r}) as (lib, w):\n"
              "    open(lib, 'w').write('x'); open(w, 'w').write('x')\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(5)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert os.listdir(tmp_path) == []
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".m.so.{int(dead.stdout)}.tmp.so"
    stale.write_text("x")
    from wide_tvm.artifact import atomic_outputs

    with atomic_outputs(str(tmp_path / "m.so")) as (lib, w):
        open(lib, "w").write("lib")
        open(w, "w").write("weights")
    assert sorted(os.listdir(tmp_path)) == ["m.so", "m.weights.npz"]


@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
def test_input_specs_name_the_vocabulary(exported, fmt):
    """What the runtime checks calls against, recorded at compile time for both formats: token ids [1, T] of int64
    that index a table of vocab_size rows (ONNX's Gather wraps negative ids first; both formats get the bound)."""
    from wide_tvm.frontends.loader import import_model

    path, _, cfg = exported("default", fmt)
    assert import_model(path).input_specs() == [{"name": "input_ids", "dtype": "int64", "shape": [1, None],
                                                  "index_bound": cfg.vocab_size}]
