"""Bad input: one clear error line, exit code 2, no partial output file."""

from __future__ import annotations

import os
import subprocess
import sys

import onnx
import pytest
from onnx import TensorProto, helper

import wide_tvm
from wide_tvm import WideError
from wide_tvm.cli import compile_main, export_main


def _cli(main, args, capsys):
    rc = main(args)
    err = capsys.readouterr().err
    return rc, err


def test_missing_model(tmp_path, capsys):
    out = tmp_path / "x.so"
    rc, err = _cli(compile_main, [str(tmp_path / "nope.onnx"), "-o", str(out)], capsys)
    assert rc == 2 and "nope.onnx: no such model file" in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("suffix", [".onnx", ".pt2"])
def test_corrupt_model(tmp_path, capsys, suffix):
    bad = tmp_path / f"bad{suffix}"
    bad.write_bytes(b"\x08\x01garbage" * 10)
    out = tmp_path / "x.so"
    rc, err = _cli(compile_main, [str(bad), "-o", str(out)], capsys)
    assert rc == 2 and str(bad) in err and "not a readable" in err
    assert not out.exists() and not (tmp_path / "x.weights.npz").exists()
    assert [p.name for p in tmp_path.iterdir()] == [bad.name]  # no temporary files left either


def test_unknown_format(tmp_path, capsys):
    f = tmp_path / "m.txt"
    f.write_text("hi")
    rc, err = _cli(compile_main, [str(f), "-o", str(tmp_path / "x.so")], capsys)
    assert rc == 2 and "unknown model format" in err


def test_unsupported_operator(tmp_path, capsys):
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example", name="weird_node")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    rc, err = _cli(compile_main, [str(path), "-o", str(tmp_path / "x.so")], capsys)
    assert rc == 2 and "weird_node" in err and "Frobnicate" in err
    assert not (tmp_path / "x.so").exists()


def test_unknown_target(exported, tmp_path, capsys):
    path, _, _ = exported("default", "onnx")
    rc, err = _cli(compile_main, [path, "--target", "tpu9000", "-o", str(tmp_path / "x.so")], capsys)
    assert rc == 2 and "unknown target 'tpu9000'" in err
    with pytest.raises(WideError, match="unknown target"):
        wide_tvm.compile(path, "cuda:banana")


def test_cuda_without_nvcc(exported, tmp_path, monkeypatch):
    import wide_tvm.compiler as compiler

    path, _, _ = exported("default", "onnx")
    monkeypatch.setattr(compiler, "nvcc_path", lambda: None)
    with pytest.raises(WideError, match="needs nvcc"):
        wide_tvm.compile(path, "cuda")


def test_group_size_must_divide(tmp_path, capsys):
    rc, err = _cli(export_main, ["-o", str(tmp_path / "m.onnx"), "--config", '{"ffn_group_size": 50}'], capsys)
    assert rc == 2 and "ffn_group_size=50 does not divide intermediate_size=192" in err
    rc, err = _cli(export_main, ["-o", str(tmp_path / "m.onnx"), "--config", '{"attn_group_size": 3}'], capsys)
    assert rc == 2 and "attn_group_size=3 does not divide num_heads=4" in err
    assert not (tmp_path / "m.onnx").exists()


def test_missing_weights_file(exported, tmp_path):
    path, _, _ = exported("default", "onnx")
    lib = tmp_path / "m.so"
    wide_tvm.compile(path, "llvm").export(str(lib))
    os.remove(tmp_path / "m.weights.npz")
    with pytest.raises(WideError, match="m.weights.npz: file not found"):
        wide_tvm.load(str(lib))


def test_cli_end_to_end(tmp_path):
    """wide-export -> wide-compile -> wide-run as a user runs them."""
    import numpy as np

    bin_dir = os.path.dirname(sys.executable)
    run = lambda *a: subprocess.run([os.path.join(bin_dir, a[0]), *a[1:]], check=True, capture_output=True,  # noqa: E731
                                    text=True, cwd=tmp_path, timeout=600)
    run("wide-export", "-o", "m.onnx")
    out = run("wide-compile", "m.onnx", "--target", "llvm", "-o", "m.so").stdout
    assert "gated FFN layers lowered: 2" in out and "gated attention layers lowered: 2" in out
    np.savez(tmp_path / "in.npz", input_ids=np.arange(6).reshape(1, 6))
    out = run("wide-run", "m.so", "--inputs", "in.npz", "--save", "out.npz").stdout
    assert "shape (1, 6, 256)" in out
    assert np.load(tmp_path / "out.npz")["logits"].shape == (1, 6, 256)


def test_missing_tuning_log(exported, tmp_path, capsys):
    path, _, _ = exported("default", "onnx")
    rc, err = _cli(compile_main, [path, "--tuning-log", str(tmp_path / "nolog"), "-o", str(tmp_path / "x.so")], capsys)
    assert rc == 2 and "nolog: tuning log folder not found" in err
    assert not (tmp_path / "x.so").exists()
