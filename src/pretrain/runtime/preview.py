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
from pretrain.data.stream import EpochStream
from pretrain.errors import report_error
from pretrain.runtime.run import build_stream

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


PAIR_LABELS = {
    "nsp": {0: "B continues A", 1: "B is from another document"},
    "sop": {0: "A and B in order", 1: "A and B swapped"},
    "three_way": {0: "B is next", 1: "B is previous", 2: "B is from another document"},
}


def preview_records(overrides: list[str], n: int) -> tuple[list[dict], str, str]:
    """The first n sequences of epoch 0 as records of plain lists (every per-token array the
    objective produced, cut at the sequence's length), the tokenizer dir and the pair task."""
    run, spec, _ = build_stream(compose_config(overrides))
    records = []
    for batch_index, batch in enumerate(EpochStream(spec, epoch=0)):
        for row, key in enumerate(batch["keys"]):
            length = int(batch["attention_mask"][row].sum())
            record = {"batch": batch_index, "key": key}
            for name, values in batch.items():
                if name != "keys" and values.ndim == 2:
                    record[name] = values[row, :length].tolist()
            record["next_sentence_label"] = int(batch["next_sentence_label"][row])
            if "decoder_input_ids" in batch:  # encoder-decoder: decoder side has its own length
                target_length = int(batch["decoder_attention_mask"][row].sum())
                for name in ("decoder_input_ids", "decoder_attention_mask", "labels"):
                    record[name] = batch[name][row, :target_length].tolist()
            if getattr(spec.corruption, "predicts_next_token", False):  # causal LM
                record["next_token_prediction"] = True
            records.append(record)
            if len(records) == n:
                break
        if len(records) == n:
            break
    return records, run.data.tokenizer_dir, spec.pair_task


def render_seq2seq(record: dict, tokenizer: Tokenizer) -> str:
    """An encoder-decoder sample: the (noised) encoder input, then the decoder's targets
    (positions not predicted, as MASS's outside its fragment, written `_`)."""
    token = tokenizer.id_to_token
    targets = [token(i) if i != IGNORE_INDEX else "_" for i in record["labels"]]
    predicted = sum(i != IGNORE_INDEX for i in record["labels"])
    header = (
        f"[batch {record['batch']}] {record['key']}  ({len(record['input_ids'])} encoder "
        f"tokens, {predicted} target tokens)"
    )
    encoder = " ".join(token(i) for i in record["input_ids"])
    return f"{header}\n  encoder: {encoder}\n  target:  {' '.join(targets)}"


def render_permutation(record: dict, tokenizer: Tokenizer) -> str:
    """An XLNet sample: targets written <token#k>, k = its place in the factorization order
    among the targets (the other tokens are the context, visible to every target)."""
    token = tokenizer.id_to_token
    ranks = np.array(record["target_rank"])
    targets = np.flatnonzero(ranks >= 0)
    place = {int(i): n + 1 for n, i in enumerate(targets[np.argsort(ranks[targets])])}
    words = [
        f"<{token(t)}#{place[i]}>" if i in place else token(t)
        for i, t in enumerate(record["input_ids"])
    ]
    header = (
        f"[batch {record['batch']}] {record['key']}  ({len(words)} tokens, {len(place)} "
        "predicted by the query stream, in the order #1, #2, ...)"
    )
    return header + "\n  " + " ".join(words)


def render(record: dict, tokenizer: Tokenizer, pair_task: str = "nsp") -> str:
    """One sequence as text: predicted positions <shown|label>, shuffled ones {shown|original},
    SpanBERT spans opened by `⟦` and closed by `⟧`."""
    token = tokenizer.id_to_token
    if "target_rank" in record:  # XLNet: factorization order of the targets
        return render_permutation(record, tokenizer)
    if "decoder_input_ids" in record:  # BART / MASS: encoder input vs decoder target
        return render_seq2seq(record, tokenizer)
    if record.get("next_token_prediction"):  # causal LM: every token after the first is a target
        targets = int(np.sum(np.array(record["labels"][1:]) != IGNORE_INDEX))
        header = f"[batch {record['batch']}] {record['key']}  ({len(record['input_ids'])} tokens, {targets} next-token targets; [CLS] = start, [SEP] = end of a document)"
        return header + "\n  " + " ".join(token(i) for i in record["input_ids"])
    shuffled = record.get("shuffle_labels", [IGNORE_INDEX] * len(record["input_ids"]))
    words = []
    for shown, label, original in zip(record["input_ids"], record["labels"], shuffled, strict=True):
        if label != IGNORE_INDEX:
            words.append(f"<{token(shown)}|{token(label)}>")
        elif original != IGNORE_INDEX:
            words.append(f"{{{token(shown)}|{token(original)}}}")
        else:
            words.append(token(shown))
    if "span_position" in record:  # mark span starts and ends
        labels = np.array(record["labels"]) != IGNORE_INDEX
        positions = np.array(record["span_position"])
        for i in np.flatnonzero(labels & (positions == 0)):
            words[i] = "⟦" + words[i]
        for i in np.flatnonzero(
            labels & np.r_[positions[1:] == 0, True] | labels & ~np.r_[labels[1:], False]
        ):
            words[i] = words[i] + "⟧"
    relation = PAIR_LABELS.get(pair_task, {}).get(record["next_sentence_label"], "single segment")
    predicted = int(np.sum(np.array(record["labels"]) != IGNORE_INDEX))
    header = f"[batch {record['batch']}] {record['key']}  ({len(words)} tokens, {predicted} predicted, {relation})"
    return header + "\n  " + " ".join(words)


def main(argv: list[str] | None = None) -> int:
    """`pretrain-data preview`: print the first n sequences; returns the exit status (2
    with a one-line error for a config or data error, e.g. an objective and a data format
    that do not go together)."""
    from pretrain.data.shard_format import ShardError
    from pretrain.errors import ConfigError

    overrides, n, fmt = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        records, tokenizer_dir, pair_task = preview_records(overrides, n)
    except (ConfigError, ShardError, FileNotFoundError) as error:
        report_error(error, "pretrain-data preview")
        return 2
    if fmt == "json":
        print(json.dumps(records))
        return 0
    tokenizer = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    own_layout = ("target_rank", "decoder_input_ids", "next_token_prediction")
    if records and not any(key in records[0] for key in own_layout):  # the MLM family
        print(
            "Predicted positions are written <shown|label> ([MASK], a random token, or the token unchanged);\n"
            "shuffled ones {shown|original}; SpanBERT spans ⟦...⟧.\n"
        )
    for record in records:
        print(render(record, tokenizer, pair_task) + "\n")
    return 0
