"""Write a PyTorch model to ONNX and to a torch.export program (.pt2), token dimension dynamic."""

from __future__ import annotations

import logging
import os
import warnings

import torch

from ..errors import WideError

MAX_TOKENS = 4096


def _dynamic_tokens():
    return {"input_ids": {1: torch.export.Dim("tokens", min=1, max=MAX_TOKENS)}}


def export_program(model: torch.nn.Module, example: torch.Tensor):
    return torch.export.export(model, (example,), dynamic_shapes=_dynamic_tokens())


def export_model(model: torch.nn.Module, example: torch.Tensor, path: str) -> str:
    """Export to `path` (.onnx or .pt2), atomically; returns the path."""
    if not path.endswith((".onnx", ".pt2")):
        raise WideError(f"{path}: output must end in .onnx or .pt2")
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    root, ext = os.path.splitext(path)
    tmp = f"{root}.{os.getpid()}.tmp{ext}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if path.endswith(".pt2"):
                torch.export.save(export_program(model, example), tmp)
            else:
                logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # its progress lines, not the user's
                torch.onnx.export(model, (example,), tmp, dynamo=True, dynamic_shapes=_dynamic_tokens(),
                                  input_names=["input_ids"], output_names=["logits"], verbose=False,
                                  external_data=False)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path
