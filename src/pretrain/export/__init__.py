"""Checkpoint <-> Hugging Face format (config.json, model.safetensors, tokenizer files)."""

from pretrain.export.checkpoint import ExportError, read_checkpoint
from pretrain.export.hf import HFModel, export_checkpoint, import_hf_model, read_hf_model

__all__ = [
    "ExportError",
    "HFModel",
    "export_checkpoint",
    "import_hf_model",
    "read_checkpoint",
    "read_hf_model",
]
