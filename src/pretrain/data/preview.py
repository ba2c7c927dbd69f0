"""`pretrain-data preview <overrides> n=8 [--format json]`: what the model will see.

Shows the first n sequences of epoch 0 after packing and corruption. Text form: tokens
decoded, each predicted position written <shown|label> ([MASK], a random token, or the token
itself left unchanged). JSON form: one record per sequence with the raw arrays.
"""

import json
import sys

import numpy as np
from tokenizers import Tokenizer

from pretrain.config import compose_config
from pretrain.data.masking import IGNORE_INDEX
from pretrain.data.stream import training_stream
from pretrain.run import build_stream

USAGE = "usage: pretrain-data preview [hydra overrides] [n=8] [--format text|json]"


def parse_args(argv: list[str]) -> tuple[list[str], int, str]:
    """Split preview's own options (n=, --format) from the training config overrides."""
    overrides, n, fmt = [], 8, "text"
    args = iter(argv)
    for arg in args:
        if arg.startswith("n="):
            n = int(arg[2:])
        elif arg == "--format":
            fmt = next(args, "")
        elif arg.startswith("--format="):
            fmt = arg.split("=", 1)[1]
        else:
            overrides.append(arg)
    if fmt not in ("text", "json") or n < 1:
        raise SystemExit(USAGE)
    return overrides, n, fmt


def preview_records(overrides: list[str], n: int) -> tuple[list[dict], str]:
    """The first n sequences of epoch 0 as records of plain lists, and the tokenizer dir."""
    config, spec, _ = build_stream(compose_config(overrides))
    tokenizer_dir = config["data"]["tokenizer_dir"]
    records = []
    for batch_index, batch in enumerate(training_stream(spec, epoch=0)):
        for row, key in enumerate(batch["keys"]):
            length = int(batch["attention_mask"][row].sum())
            record = {"batch": batch_index, "key": key}
            for name in ("input_ids", "labels", "token_type_ids", "attention_mask"):
                record[name] = batch[name][row, :length].tolist()
            record["next_sentence_label"] = int(batch["next_sentence_label"][row])
            records.append(record)
            if len(records) == n:
                return records, tokenizer_dir
    return records, tokenizer_dir


def render(record: dict, tokenizer: Tokenizer) -> str:
    """One sequence as text with predicted positions marked <shown|label>."""
    words = []
    for shown, label in zip(record["input_ids"], record["labels"], strict=True):
        token = tokenizer.id_to_token(shown)
        words.append(
            token if label == IGNORE_INDEX else f"<{token}|{tokenizer.id_to_token(label)}>"
        )
    nsp = {0: "B continues A", 1: "B is random"}.get(
        record["next_sentence_label"], "single segment"
    )
    masked = int(np.sum(np.array(record["labels"]) != IGNORE_INDEX))
    return (
        f"[batch {record['batch']}] {record['key']}  ({len(words)} tokens, {masked} predicted, {nsp})\n  "
        + " ".join(words)
    )


def main(argv: list[str] | None = None) -> None:
    overrides, n, fmt = parse_args(sys.argv[1:] if argv is None else argv)
    records, tokenizer_dir = preview_records(overrides, n)
    if fmt == "json":
        print(json.dumps(records))
        return
    tokenizer = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    print(
        "Predicted positions are written <shown|label>: [MASK], a random token, or the token unchanged.\n"
    )
    for record in records:
        print(render(record, tokenizer) + "\n")
