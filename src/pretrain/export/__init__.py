"""Checkpoint -> Hugging Face format (config.json, model.safetensors, tokenizer files)."""

from pretrain.export.bert import bert_to_hf_state_dict, export_checkpoint, hf_config
from pretrain.export.checkpoint import ExportError, read_checkpoint

__all__ = [
    "ExportError",
    "bert_to_hf_state_dict",
    "export_checkpoint",
    "hf_config",
    "read_checkpoint",
]
