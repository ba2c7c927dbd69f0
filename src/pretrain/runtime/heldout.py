"""Held-out evaluation of an MLM-family module: MLM accuracy and sentence-task accuracy."""

from collections.abc import Iterable

import torch

from pretrain.data.masking import IGNORE_INDEX
from pretrain.objectives.mlm import MaskedLanguageModel


@torch.no_grad()
def heldout_accuracy(module: MaskedLanguageModel, batches: Iterable[dict]) -> dict[str, float]:
    """Accuracy of the MLM head on the predicted positions of `batches` and, when the module
    has a sentence head and the batches carry sentence labels, of that head. Counts every
    prediction equally (micro average). Returns {"mlm_accuracy", ["sentence_accuracy"],
    "predictions"}."""
    was_training = module.training
    module.eval()
    head = module.sentence_head
    mlm_right = mlm_total = sentence_right = sentence_total = 0
    for batch in batches:
        hidden = module.encoder(
            batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
        )
        selected = batch["labels"] != IGNORE_INDEX
        predictions = module.mlm_head(hidden[selected]).argmax(-1)
        mlm_right += int((predictions == batch["labels"][selected]).sum())
        mlm_total += int(selected.sum())
        labels = batch["next_sentence_label"]
        if head is not None and (labels != IGNORE_INDEX).all():
            sentence_right += int((head(hidden).argmax(-1) == labels).sum())
            sentence_total += len(labels)
    module.train(was_training)
    result = {"mlm_accuracy": mlm_right / max(mlm_total, 1), "predictions": mlm_total}
    if sentence_total:
        result["sentence_accuracy"] = sentence_right / sentence_total
    return result
