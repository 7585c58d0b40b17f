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
                       (path, "would overwrite the model file"), ("/proc/wide/m.so", "cannot write in /proc")):
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
    # Ctrl-C: KeyboardInterrupt through the same cleanup (Python's own handler set first: a test run started in the
    # background of a non-interactive shell inherits SIGINT ignored, and Python then leaves it so)
    interrupt = script.replace("SIGTERM", "SIGINT").replace(
        "import os, signal, time\n", "import os, signal, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n")
    proc = subprocess.run([sys.executable, "-c", interrupt], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr and os.listdir(tmp_path) == []
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


def test_load_checks_the_library_and_its_weights(library, exported, tmp_path):
    """wide_tvm.load opens a library only when its weights file was written for it by wide-compile (format and the
    library's content hash in the metadata): a changed library, another model's weights, a truncated, text or
    older-format weights file are one WideError each, and nothing is loaded."""
    import json
    import shutil

    from wide_tvm.artifact import META_KEY

    _, lib, _, _ = library
    other = str(tmp_path / "other.so")
    wide_tvm.compile(exported("groups_1_16", "pt2")[0], "llvm").export(other)
    weights = lib.replace(".so", ".weights.npz")

    def case(name: str, lib_bytes: bytes | None = None, weights_bytes: bytes | None = None) -> str:
        path = tmp_path / name
        path.mkdir()
        (path / "m.so").write_bytes(open(lib, "rb").read() if lib_bytes is None else lib_bytes)
        (path / "m.weights.npz").write_bytes(open(weights, "rb").read() if weights_bytes is None else weights_bytes)
        return str(path / "m.so")

    good = open(weights, "rb").read()
    with np.load(weights) as data:
        old = {k: data[k] for k in data.files}
    meta = json.loads(bytes(old[META_KEY]).decode()) | {"format": 1}
    old[META_KEY] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(tmp_path / "old.npz", **old)
    for name, lib_bytes, weights_bytes, match in (
            ("changed", open(lib, "rb").read() + b"\0", None, "does not match"),
            ("foreign", None, open(other.replace(".so", ".weights.npz"), "rb").read(), "does not match"),
            ("truncated", None, good[:len(good) // 2], "not a weights file written by wide-compile"),
            ("text", None, b"hello\n", "not a weights file written by wide-compile"),
            ("old", None, open(tmp_path / "old.npz", "rb").read(), "format 1, this wide_tvm reads 2")):
        with pytest.raises(wide_tvm.WideError, match=match):
            wide_tvm.load(case(name, lib_bytes, weights_bytes))
    shutil.rmtree(tmp_path / "changed")
    assert wide_tvm.load(case("copy")).input_names == ["input_ids"]  # a copy elsewhere loads


def warnings_silenced():
    import contextlib
    import logging

    @contextlib.contextmanager
    def quiet():
        logger = logging.getLogger("torch._export.serde.serialize")
        level = logger.level
        logger.setLevel(logging.CRITICAL)
        try:
            yield
        finally:
            logger.setLevel(level)

    return quiet()


def _rewritten_pt2(src: str, dst: str, edit) -> None:
    """Copy the .pt2 at `src` to `dst`, each member's bytes passed through edit(relative name, bytes)."""
    import zipfile

    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst, "w") as b:
        for info in a.infolist():
            b.writestr(info, edit(info.filename.split("/", 1)[1], a.read(info.filename)))


class _Marker:
    """Unpickling this creates the file at `path` (what a crafted model file would do instead)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_model_file_never_runs_code(exported, tmp_path):
    """A .pt2 whose sample inputs are a crafted pickle compiles without unpickling them (torch would, falling back
    to weights_only=False); one whose weight is a pickled payload is refused by name; neither runs its code."""
    import contextlib
    import io
    import json

    path, _, _ = exported("default", "pt2")
    marker = tmp_path / "ran"
    buffer = io.BytesIO()
    torch.save(_Marker(str(marker)), buffer)  # as torch.load reads a payload
    evil = buffer.getvalue()
    crafted = str(tmp_path / "inputs.pt2")
    _rewritten_pt2(path, crafted, lambda name, data: evil if name.startswith("data/sample_inputs/") else data)
    with warnings_silenced(), contextlib.suppress(Exception):
        torch.export.load(crafted)  # torch itself runs it ...
    assert marker.exists()
    marker.unlink()
    from wide_tvm.frontends.loader import import_model

    assert len(import_model(crafted).weights) > 0 and not marker.exists()  # ... wide-compile does not

    def pickled_weight(name: str, data: bytes) -> bytes:
        if name == "data/weights/model_weights_config.json":
            config = json.loads(data)
            first = next(iter(config["config"].values()))
            first["use_pickle"] = True
            return json.dumps(config).encode()
        return evil if name == "data/weights/weight_0" else data

    crafted = str(tmp_path / "weights.pt2")
    _rewritten_pt2(path, crafted, pickled_weight)
    with pytest.raises(wide_tvm.WideError, match="holds a pickled payload .*would run code"):
        import_model(crafted)
    assert not marker.exists()
    text = tmp_path / "text.pt2"
    text.write_text("hello\n")
    with pytest.raises(wide_tvm.WideError, match="not a readable torch.export program"):
        import_model(str(text))


def test_file_errors_come_before_tvm_and_torch_load(tmp_path):
    """A missing or wrong model file, a missing library or inputs file fail before TVM or torch is imported (under a
    second instead of 4-5 s), with one line and exit 2."""
    text = tmp_path / "t.pt2"
    text.write_text("hello\n")
    script = ("import sys\nfrom wide_tvm.cli import compile_main, run_main\n"
              f"codes = [compile_main([{str(tmp_path / 'no.onnx')!r}, '-o', 'x.so']), "
              f"compile_main([{str(text)!r}, '-o', 'x.so']), compile_main([{str(tmp_path)!r}, '-o', 'x.so']), "
              f"run_main([{str(tmp_path / 'no.so')!r}, '--inputs', 'no.npz'])]\n"
              "print(codes, 'tvm' in sys.modules, 'torch' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.stdout.strip() == "[2, 2, 2, 2] False False", proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("error: ") for line in lines), proc.stderr
    assert "no such model file" in lines[0] and "not a zip archive" in lines[1] and "a folder" in lines[2]


def test_torn_tuning_records_are_skipped_and_repaired(tmp_path):
    """A record line cut short (a tuner killed mid-append) is skipped with one TornRecordWarning by every reader
    (the picks stay those of the intact lines) and dropped by the next writer; a damaged line before the last
    workload is a clear error."""
    import shutil
    import warnings

    from wide_tvm.tuning import database
    from wide_tvm.tuning.folders import shipped_root

    folder = str(tmp_path / "llvm")
    shutil.copytree(shipped_root() / "llvm", folder)
    want = database.load(folder)
    with open(tmp_path / "llvm" / database.RECORD_FILE, "a") as f:
        f.write('[3, [[["GetSBlock", [], ["ro')  # a kill mid-append
    with pytest.warns(database.TornRecordWarning, match="skipped 1 torn database line"):
        assert database.load(folder) == want
    with pytest.warns(database.TornRecordWarning, match="dropped 1 torn"):
        assert database.repair(folder) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", database.TornRecordWarning)
        assert database.load(folder) == want and database.repair(folder) == 0
    lines = open(tmp_path / "llvm" / database.WORKLOAD_FILE).read().splitlines()
    lines[0] = lines[0][:20]  # a damaged line, not an unterminated last one
    (tmp_path / "llvm" / database.WORKLOAD_FILE).write_text("\n".join(lines) + "\n")
    with pytest.raises(wide_tvm.WideError, match="line 1 is unreadable"):
        database.load(folder)


def test_tunings_shipped_and_the_users_own(tmp_path, monkeypatch):
    """The committed tunings are found as package data; wide-tune writes into the user's folder by default, never
    the source tree; a compile applies the user's picks on top of the shipped ones, bucket by bucket; one tuner at a
    time writes a folder (a second waits, here until its timeout)."""
    from wide_tvm.cli import tune_main
    from wide_tvm.tuning.folders import default_folders, folder_lock, merge_entries, shipped_root, user_root

    monkeypatch.setenv("WIDE_TVM_TUNING_HOME", str(tmp_path / "home"))
    assert user_root() == tmp_path / "home" and (shipped_root() / "llvm" / "database_workload.json").exists()
    assert default_folders("llvm") == [str(shipped_root() / "llvm")]
    assert tune_main(["--target", "llvm", "--show"]) == 0  # the user's folder: nothing there yet
    (tmp_path / "home" / "llvm").mkdir(parents=True)
    (tmp_path / "home" / "llvm" / "kernel_knobs.json").write_text('{"entries": {}}')
    assert default_folders("llvm") == [str(shipped_root() / "llvm"), str(tmp_path / "home" / "llvm")]
    base = {"k": {"cpu": [{"bm": 1, "bn": 4}, {"bm": 2, "bn": 4}, None], "us": [1.0]}}
    over = {"k": {"cpu": [None, {"bm": 8, "bn": 4}, {"bm": 4, "bn": 4}]}, "j": {"cpu": [None] * 3}}
    assert merge_entries(base, over) == {"k": {"cpu": [{"bm": 1, "bn": 4}, {"bm": 8, "bn": 4}, {"bm": 4, "bn": 4}],
                                               "us": [1.0]}, "j": {"cpu": [None] * 3}}
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom wide_tvm.tuning.folders import folder_lock\n"
                               f"with folder_lock({str(tmp_path / 'db')!r}):\n    print('held', flush=True)\n"
                               "    time.sleep(30)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(wide_tvm.WideError, match="another wide-tune is writing"):
            with folder_lock(str(tmp_path / "db"), timeout=0.5):
                pass
    finally:
        holder.kill()
        holder.wait()
    with folder_lock(str(tmp_path / "db"), timeout=5):  # released with its process
        pass


@pytest.mark.slow
def test_stress_one_model_eight_threads_thousand_calls(library):
    """1,000 calls of mixed lengths on one loaded model from 8 threads: every output equals the single-threaded one,
    and the process's memory stays flat (no growth per call past the first calls of each thread)."""
    import psutil

    runner = library[0]
    rng = np.random.default_rng(1)
    cases = [rng.integers(0, 256, (1, int(t))) for t in rng.integers(1, 65, 40)]
    want = [runner(ids) for ids in cases]
    proc = psutil.Process()
    errors = []

    def work(k: int, calls: int):
        for i in range(calls):
            j = (k * 13 + i) % len(cases)
            if not np.array_equal(runner(cases[j]), want[j]):
                errors.append((k, j))

    def run(calls: int):
        threads = [threading.Thread(target=work, args=(k, calls)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    run(5)  # each thread's VM and workspace allocated
    before = proc.memory_info().rss
    run(125)  # 8 x 125 = 1,000 calls
    grown = proc.memory_info().rss - before
    assert errors == [] and grown < 64 * 2**20, (errors[:5], grown / 2**20)
