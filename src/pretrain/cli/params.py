"""`pretrain-params model=NAME [overrides] [vocab_size=N] [--format json]`: a model's parameter
counts, first the way its paper counts them (the encoder, plus BERT's [CLS] pooler for the
families whose papers count it: BERT 110M, ALBERT-base 12M, RoBERTa, ELECTRA), then the
encoder (embeddings and the rest) and the pooler.

The model is built on the meta device, so no weights are allocated: even xxlarge sizes print
in a few seconds, most of them torch's import. The shipped model configs at their paper
vocabularies are answered from `param_counts.json` without importing torch (under a second):
a table this module writes (`python -m pretrain.cli.params --write-table`, also run by
`make conf-tables`), each entry keyed by the SHA-256 of the composed model config, so any
override misses it and is counted afresh; a test rebuilds every entry and compares. The
vocabulary is the paper's (`model.reference_vocab_size`) unless `vocab_size=N` is given.
Pretraining heads (MLM, NSP/SOP classifier, SBO, ...) are not counted.

(`pretrain-data info` is about shards.)
"""

import argparse
import hashlib
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pretrain.config import ConfigError, component_config, compose_config
from pretrain.errors import report_error
from pretrain.paths import CONF_DIR

TABLE = Path(__file__).with_name("param_counts.json")


@contextmanager
def skipped_initialisation() -> Iterator[None]:
    """torch.nn.init's initialisers as no-ops while a model is built on the meta device (its
    values are never read; torch's meta `normal_` loads torch._dynamo, seconds of start-up)."""
    import torch

    names = [name for name in vars(torch.nn.init) if name.endswith("_") and name[0] != "_"]
    saved = {name: getattr(torch.nn.init, name) for name in names}
    try:
        for name in names:
            setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, initialiser in saved.items():
            setattr(torch.nn.init, name, initialiser)


def parameter_counts(
    model_cfg: dict, vocab_size: int, pad_token_id: int = 0
) -> dict[str, int | str]:
    """Parameter counts (shared parameters counted once) of the model `model_cfg` describes:
    "total" the encoder's, split into "embeddings" (its `embeddings` submodule) and "rest";
    "pooler" BERT's [CLS] pooler (hidden x hidden + hidden) where the family's paper counts
    it (the encoder's `paper_counts_pooler`), else 0; "paper_total" = total + pooler, the
    paper's way; "paper_counts" names the parts paper_total includes."""
    import torch  # here, not at the top: `--help` and a bad override answer without it

    from pretrain.models.build import build_encoder, count_parameters

    with torch.device("meta"), skipped_initialisation():
        encoder = build_encoder(model_cfg, vocab_size, pad_token_id)
    total = count_parameters(encoder)
    embeddings = count_parameters(encoder.embeddings) if hasattr(encoder, "embeddings") else 0
    pooler = 0
    if getattr(encoder, "paper_counts_pooler", False):
        hidden = model_cfg["hidden_size"]
        pooler = hidden * hidden + hidden
    parts = "encoder + [CLS] pooler" if pooler else "encoder (the paper's model has no pooler)"
    return {
        "total": total,
        "embeddings": embeddings,
        "rest": total - embeddings,
        "pooler": pooler,
        "paper_total": total + pooler,
        "paper_counts": f"{parts}; pretraining heads not counted",
    }


def model_info(overrides: list[str], vocab_size: int | None = None) -> dict:
    """Compose the `model` group with Hydra `overrides` and count its parameters: from
    `param_counts.json` when the composed config and vocabulary are a shipped model's as
    stored (no torch import), else checked and counted on the meta device."""
    from omegaconf import OmegaConf

    cfg = compose_config(overrides)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    name, vocab = model.get("name"), vocab_size or model.get("reference_vocab_size")
    stored = read_table().get(name)
    if isinstance(stored, dict) and stored.get("key") == config_key(model, vocab):
        if not set(COUNT_KEYS) - set(stored):
            return {"model": name, "vocab_size": vocab, **{k: stored[k] for k in COUNT_KEYS}}
    checked = component_config("model", model)
    vocab = vocab_size or checked.reference_vocab_size
    if vocab is None:
        raise ConfigError(
            f"model.reference_vocab_size of {checked.name} is not set; pass vocab_size=N"
        )
    return {"model": checked.name, "vocab_size": vocab, **parameter_counts(model, vocab)}


COUNT_KEYS = ("total", "embeddings", "rest", "pooler", "paper_total", "paper_counts")


def config_key(model: dict, vocab_size: int) -> str:
    """SHA-256 of the composed model config and the vocabulary: what the counts depend on."""
    text = json.dumps({"model": model, "vocab_size": vocab_size}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def read_table() -> dict:
    """The stored counts {model name: {"key", counts...}}; {} when the file is missing or is
    not such a table (then every count is computed)."""
    try:
        table = json.loads(TABLE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}


def shipped_counts() -> dict:
    """Every shipped model config's counts at its paper vocabulary, as `param_counts.json`
    stores them (configs without a paper vocabulary are left out)."""
    from omegaconf import OmegaConf

    table = {}
    for path in sorted((CONF_DIR / "model").glob("*.yaml")):
        cfg = compose_config([f"model={path.stem}"])
        model = OmegaConf.to_container(cfg.model, resolve=True)
        vocab = component_config("model", model).reference_vocab_size
        if vocab is not None:
            key = config_key(model, vocab)
            table[path.stem] = {"key": key, **parameter_counts(model, vocab)}
    return table


def write_table() -> None:
    """Rewrite `param_counts.json` from the shipped model configs."""
    TABLE.write_text(json.dumps(shipped_counts(), indent=1, sort_keys=True) + "\n")


def format_table(info: dict) -> str:
    """The counts as an aligned text table, in millions and exactly."""
    rows = [("parameters", "millions", "count")]
    rows += [
        (label, f"{info[key] / 1e6:.2f}M", f"{info[key]:,}")
        for label, key in (
            ("paper count", "paper_total"),
            ("encoder", "total"),
            ("  embeddings", "embeddings"),
            ("  rest", "rest"),
            ("pooler", "pooler"),
        )
    ]
    width = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [f"model {info['model']} (vocabulary {info['vocab_size']:,} tokens)"]
    lines += [
        "  ".join(cell.rjust(width[i]) if i else cell.ljust(width[i]) for i, cell in enumerate(row))
        for row in rows
    ]
    lines.append(f"paper count = {info['paper_counts']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit status (2 on a config error)."""
    prog = "pretrain-params"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=albert_base")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument("--write-table", action="store_true", help=f"rewrite {TABLE.name}")
    args = parser.parse_args(argv)
    if args.write_table:
        write_table()
        print(f"wrote {TABLE}")
        return 0
    vocab = [o for o in args.overrides if o.startswith("vocab_size=")]
    overrides = [o for o in args.overrides if not o.startswith("vocab_size=")]
    try:
        info = model_info(overrides, int(vocab[-1].split("=", 1)[1]) if vocab else None)
    except (ConfigError, ValueError) as error:
        report_error(error, prog)
        return 2
    print(json.dumps(info) if args.format == "json" else format_table(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
