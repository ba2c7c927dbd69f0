"""`python -m pretrain.export.check DIR [TEXT]`: load an exported directory with `transformers`
and fill in the [MASK] of a sentence, to show the export works outside this project."""

import sys

import torch

DEFAULT_TEXT = "The [MASK] statement imports a module into the current namespace."


def fill_mask(export_dir: str, text: str = DEFAULT_TEXT, top_k: int = 5) -> list[str]:
    """Top-k tokens that the exported BertForPreTraining predicts at the first [MASK] of text."""
    from transformers import AutoTokenizer, BertForPreTraining

    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    model = BertForPreTraining.from_pretrained(export_dir).eval()
    inputs = tokenizer(text, return_tensors="pt")
    position = (inputs["input_ids"][0] == tokenizer.mask_token_id).nonzero()[0, 0]
    with torch.no_grad():
        logits = model(**inputs).prediction_logits[0, position]  # (vocab,)
    return tokenizer.convert_ids_to_tokens(logits.topk(top_k).indices.tolist())


def main() -> None:
    export_dir = sys.argv[1]
    text = sys.argv[2] if len(sys.argv) > 2 else DEFAULT_TEXT
    predictions = fill_mask(export_dir, text)
    print(f"Loaded {export_dir} with transformers.BertForPreTraining and AutoTokenizer.")
    print(f"{text!r}: [MASK] -> {', '.join(predictions)}")


if __name__ == "__main__":
    main()
