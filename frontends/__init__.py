"""Import exported WIDE models (ONNX, torch.export .pt2) into Relax with weights kept as parameters."""

from .loader import ImportedModel, import_model

__all__ = ["ImportedModel", "import_model"]
