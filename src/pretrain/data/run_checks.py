"""The data section's checks against the rest of the run: what the input format, document
masks and batch-size warm-up need of the model, the objective's stages and the strategy;
the stages' context (`stage_context`: their lengths and RoPE thetas).
Run once by the config's validation (`pretrain.config.validation.validate_run`); `run` is a
typed run config (`pretrain.config.TrainConfig`), named in docstrings: the config sits above
data in the layers."""

from typing import Any

from pretrain.data.input_formats import INPUT_FORMATS
from pretrain.errors import require


def formats_with(flag: str) -> str:
    """The `data=` choices whose InputFormat has `flag` set, for a message: "a, b or c"."""
    names = [name for name, spec in INPUT_FORMATS.items() if getattr(spec, flag)]
    return ", ".join(names[:-1]) + " or " + names[-1]


def check_data_against_run(run: Any) -> None:
    """ConfigError naming the key when data.format keeps a memory across steps with
    objective.stages or a batch-size warm-up, data.document_masks is set without packed
    documents or a model that masks attention by document, the warm-up runs under DeepSpeed,
    or data.max_seq_length exceeds the model's positions; a stage's mix (`check_stage_mix`)."""
    data, model = run.data, run.model
    memory = INPUT_FORMATS[data.format].memory
    require(
        not (run.objective.stages and memory),
        "objective.stages",
        run.objective.stages,
        f"data.format={data.format} carries a memory across steps, which a change of "
        "corruption would break; use another format or leave objective.stages out",
    )
    require(
        not data.document_masks or INPUT_FORMATS[data.format].crosses_documents,
        "data.document_masks",
        data.document_masks,
        f"needs rows that pack documents (data={formats_with('crosses_documents')}; "
        f"data.format is {data.format!r}); set it to false",
    )
    require(
        not data.document_masks or model.attends_by_document,
        "data.document_masks",
        data.document_masks,
        f"model {model.name} cannot mask attention by document; use a modernbert "
        "model or set it to false",
    )
    warmup = data.batch_size_warmup_tokens is not None
    require(
        not warmup or not memory,
        "data.batch_size_warmup_tokens",
        data.batch_size_warmup_tokens,
        f"data.format={data.format} has one memory slot per sample of the global "
        "batch, which cannot grow; set it to null",
    )
    require(
        not warmup or not run.strategy.name.startswith("deepspeed"),
        "data.batch_size_warmup_tokens",
        data.batch_size_warmup_tokens,
        "DeepSpeed's engine accumulates a fixed number of micro-batches per step; use "
        "strategy=ddp (or auto) with the warm-up, or set it to null",
    )
    longest = model.max_sequence_tokens
    require(
        longest is None or data.max_seq_length <= longest,
        "data.max_seq_length",
        data.max_seq_length,
        f"must not exceed the {longest} positions of model {model.name}",
    )
    check_stage_mix(run)


def check_stage_mix(run: Any) -> None:
    """ConfigError naming objective.stages[k].source_weights unless it maps names of
    data.sources to weights >= 0 with a positive sum (a source left out: none in that phase),
    and only with data.sources."""
    names = [source.name for source in run.data.sources]
    for number, stage in enumerate(run.objective.stages or []):
        weights = stage.get("source_weights")
        if weights is None:
            continue
        key = f"objective.stages[{number}].source_weights"
        require(bool(names), key, weights, "mixes data.sources: list the sources there")
        require(hasattr(weights, "items"), key, weights, "must map source names to weights")
        unknown = sorted(set(weights) - set(names))
        require(not unknown, key, weights, f"names no source of data.sources ({', '.join(names)})")
        values = [float(w) for w in weights.values()]
        require(
            min(values, default=0) >= 0 and sum(values) > 0,
            key,
            weights,
            "needs weights >= 0 and at least one above 0",
        )


def stage_context(run: Any) -> tuple[tuple[int, ...] | None, tuple[float, ...] | None]:
    """The stages' sequence lengths (objective.stages[k].max_seq_length, else
    data.max_seq_length) and global RoPE thetas (.global_rope_theta, else the model's), each
    None when no stage sets it. ConfigError naming objective.stages[k].<key> when a length is
    not in 8 .. data.max_seq_length (the run's longest, which sizes its shapes), a length
    stage's format does not pack sentences, or the model has no global RoPE theta. `run`: a
    typed run config (`pretrain.config.TrainConfig`), checked once by its validation and
    read again when the objective builds its corruption."""
    stages = run.objective.stages or []
    lengths, thetas = [], []
    for number, stage in enumerate(stages):
        where = f"objective.stages[{number}]"
        length = stage.get("max_seq_length", run.data.max_seq_length)
        require(
            isinstance(length, int) and 8 <= length <= run.data.max_seq_length,
            f"{where}.max_seq_length",
            length,
            f"must be a whole number of tokens from 8 to data.max_seq_length "
            f"({run.data.max_seq_length}, the run's longest)",
        )
        require(
            length == run.data.max_seq_length or INPUT_FORMATS[run.data.format].staged_lengths,
            f"{where}.max_seq_length",
            length,
            f"data.format={run.data.format} does not pack sentences to a length; use "
            f"data={formats_with('staged_lengths')}",
        )
        default_theta = getattr(run.model, "global_rope_theta", None)
        require(
            "global_rope_theta" not in stage or default_theta is not None,
            f"{where}.global_rope_theta",
            stage.get("global_rope_theta"),
            f"model {run.model.name} has no RoPE theta (a modernbert model has)",
        )
        theta = stage.get("global_rope_theta", default_theta)
        require(
            theta is None or theta > 0,
            f"{where}.global_rope_theta",
            theta,
            "must be positive",
        )
        lengths.append(length)
        thetas.append(theta)
    staged_lengths = any(n != run.data.max_seq_length for n in lengths)
    staged_thetas = any("global_rope_theta" in stage for stage in stages)
    return (tuple(lengths) if staged_lengths else None, tuple(thetas) if staged_thetas else None)
