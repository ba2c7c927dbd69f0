"""transformers' own masked-LM pretraining recipe, written as its `run_mlm.py` example does it,
for benchmarks/vs_hf_pretraining.py: a `datasets` Dataset of texts, tokenized, concatenated
and cut into blocks of `--max-seq-length` tokens (`group_texts`), `BertForMaskedLM` from a
local config.json, `DataCollatorForLanguageModeling` (15% of tokens, 80/10/10) and `Trainer`
with its defaults but the optimizer settings, peak learning rate, warm-up, batch size and
step count given here. `--max-time-s` stops it at the first optimizer step past that many
seconds since the process started (Trainer has no time budget; a TrainerCallback is its way
to stop), then `save_model` writes the Hugging Face directory. Nothing is downloaded.

    python benchmarks/hf_mlm_recipe.py --texts T.jsonl --config-dir C --tokenizer-dir K
        --out-dir O --max-steps N --max-time-s S [--lr 3e-3 --warmup-steps 100 ...]
"""

import argparse
import json
import os
import time
from itertools import chain

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import psutil  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig,
    AutoTokenizer,
    BertForMaskedLM,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)


class StopAfter(TrainerCallback):
    """Ends training at the first optimizer step past `max_time_s` of the process's life, or
    at optimizer step `stop_at_step` (the schedule still runs to --max-steps)."""

    def __init__(self, max_time_s: float | None, stop_at_step: int | None = None) -> None:
        self.max_time_s, self.stop_at_step = max_time_s, stop_at_step
        self.started = psutil.Process().create_time()

    def on_step_end(self, args, state, control, **kwargs):
        if self.max_time_s is not None and time.time() - self.started >= self.max_time_s:
            control.should_training_stop = True
        if self.stop_at_step is not None and state.global_step >= self.stop_at_step:
            control.should_training_stop = True
        return control


def grouped_dataset(texts: list[str], tokenizer, block_size: int) -> Dataset:
    """run_mlm.py's path when not line_by_line: tokenize every text (with its special tokens),
    concatenate them all, and cut into blocks of `block_size`, the remainder dropped."""
    raw = Dataset.from_dict({"text": texts})
    tokenized = raw.map(
        lambda examples: tokenizer(examples["text"], return_special_tokens_mask=True),
        batched=True,
        remove_columns=["text"],
    )

    def group_texts(examples):
        concatenated = {k: list(chain(*examples[k])) for k in examples.keys()}
        total_length = len(concatenated[next(iter(examples.keys()))])
        total_length = (total_length // block_size) * block_size
        return {
            k: [t[i : i + block_size] for i in range(0, total_length, block_size)]
            for k, t in concatenated.items()
        }

    return tokenized.map(group_texts, batched=True)


def main(argv: list[str] | None = None) -> None:
    """Trains and writes the model, tokenizer and `recipe_summary.json` (steps, tokens,
    seconds) to --out-dir."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--texts", required=True, help="JSON lines, one {'text': ...} a document")
    p.add_argument("--config-dir", required=True)
    p.add_argument("--tokenizer-dir", required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--max-steps", type=int, required=True)
    p.add_argument("--max-time-s", type=float, default=None)
    p.add_argument("--stop-at-step", type=int, default=None, help="stop there, schedule unchanged")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup-steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-seq-length", type=int, default=64)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--adam-epsilon", type=float, default=1e-6)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    with open(args.texts, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_dir)
    train_dataset = grouped_dataset(texts, tokenizer, args.max_seq_length)
    model = BertForMaskedLM(AutoConfig.from_pretrained(args.config_dir))
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    training_args = TrainingArguments(
        output_dir=args.out_dir,
        use_cpu=True,
        report_to="none",
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        adam_epsilon=args.adam_epsilon,
        max_steps=args.max_steps,
        seed=args.seed,
    )
    stop = args.max_time_s is not None or args.stop_at_step is not None
    callbacks = [StopAfter(args.max_time_s, args.stop_at_step)] if stop else []
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    result = trainer.train()
    trainer.save_model(args.out_dir)
    steps = trainer.state.global_step
    summary = {
        "steps": steps,
        "sequences": steps * args.batch_size,
        "tokens": steps * args.batch_size * args.max_seq_length,
        "train_loss": result.training_loss,
        "blocks": len(train_dataset),
        "process_s": time.time() - psutil.Process().create_time(),
    }
    with open(os.path.join(args.out_dir, "recipe_summary.json"), "w") as f:
        json.dump(summary, f)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
