"""`python -m pretrain.export.check DIR [TEXT]`: load an exported directory with `transformers`
(the class its config.json names: BertForMaskedLM for masked LM alone, BertForPreTraining
with NSP or SOP, ...) and fill in the [MASK] of a sentence, to show the export works outside
this project. A directory that ships a program instead (`pretrain-compress`: int8 as
TorchScript `model.ts`, a head-pruned model as the `torch.export` program `model.pt2`) is run
through torch's loader of that file, the tokenizer still transformers'."""

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from pretrain.errors import report_error
from pretrain.export.checkpoint import ExportError

DEFAULT_TEXT = "The [MASK] statement imports a module into the current namespace."
PROGRAMS = ("model.ts", "model.pt2")  # pretrain-compress's, preferred to model.safetensors


class ProgramLogits:
    """A shipped program, (ids, types, mask) -> logits, called as a transformers model."""

    def __init__(self, path: Path) -> None:
        self.path = path
        loaded = torch.jit.load(str(path)) if path.suffix == ".ts" else None
        self.program = loaded or torch.export.load(path).module()

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None) -> SimpleNamespace:
        types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        return SimpleNamespace(logits=self.program(input_ids, types, mask))


def load_exported(export_dir: str) -> tuple[object, object]:
    """(model in eval mode, tokenizer) of an exported directory, the model of the class its
    config names (`architectures`), so that every weight it holds is loaded and none is
    made up."""
    import logging
    import os

    if not os.path.isfile(os.path.join(export_dir, "config.json")):
        raise ExportError(
            f"{export_dir}: no config.json, not an exported directory (pretrain-export CKPT DIR "
            "writes one)"
        )
    import transformers

    from pretrain.export.hf import import_torchao

    # transformers imports torchao when it is installed: its CUDA libraries a CPU build cannot
    # load, and the enums it registers with torch, are noise here
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    import_torchao()
    tokenizer = transformers.AutoTokenizer.from_pretrained(export_dir)
    for name in PROGRAMS:
        if (Path(export_dir) / name).is_file():
            return ProgramLogits(Path(export_dir) / name), tokenizer
    config = transformers.AutoConfig.from_pretrained(export_dir)
    name = (config.architectures or ["AutoModelForMaskedLM"])[0]
    model_class = getattr(transformers, name, None)
    if model_class is None:
        raise ExportError(
            f"{export_dir}/config.json: architecture {name!r} is unknown to transformers"
        )
    return model_class.from_pretrained(export_dir).eval(), tokenizer


def fill_mask(model, tokenizer, text: str = DEFAULT_TEXT, top_k: int = 5) -> list[str]:
    """Top-k tokens that an exported model (`load_exported`) predicts at the first [MASK] of
    text."""
    inputs = tokenizer(text, return_tensors="pt")
    position = (inputs["input_ids"][0] == tokenizer.mask_token_id).nonzero()[0, 0]
    with torch.no_grad():
        output = model(**inputs)
    logits = getattr(output, "prediction_logits", None)  # *ForPreTraining
    logits = (output.logits if logits is None else logits)[0, position]  # (vocab,)
    return tokenizer.convert_ids_to_tokens(logits.topk(top_k).indices.tolist())


def main() -> int:
    export_dir = sys.argv[1]
    text = sys.argv[2] if len(sys.argv) > 2 else DEFAULT_TEXT
    try:
        model, tokenizer = load_exported(export_dir)
    except (ExportError, OSError) as error:  # OSError: files transformers cannot read
        report_error(error, "pretrain.export.check")
        return 2
    predictions = fill_mask(model, tokenizer, text)
    how = f"transformers.{type(model).__name__}"
    if isinstance(model, ProgramLogits):
        loader = "torch.jit.load" if model.path.suffix == ".ts" else "torch.export.load"
        how = f"{loader}({model.path.name})"
    print(f"Loaded {export_dir} with {how} and AutoTokenizer.")
    print(f"{text!r}: [MASK] -> {', '.join(predictions)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
