"""The settings of every objective: one dataclass per objective module (its `config_class`),
registered in Hydra's ConfigStore as `schema/objective/<name>` so that `conf/objective/*.yaml`
start from it and give only what differs. Torch-free: `pretrain` checks these values before
torch loads. A default is written here once; the corruptions and modules read these fields.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pretrain.errors import (
    ConfigError,
    require,
    require_positive,
    require_probabilities,
    require_unit_interval,
)


@dataclass
class ObjectiveConfig:
    """What every objective's config has; each objective module subclasses it with its own
    settings (`<module>.config_class`), checked when the run config is validated."""

    name: str = "mlm_nsp"
    _target_: str = "pretrain.objectives.mlm.MaskedLanguageModel"
    # dynamic: masks drawn again every epoch. static: BERT's dupe_factor copies, the mask of
    # epoch e is the mask of copy e % dupe_factor.
    masking: str = "dynamic"
    dupe_factor: int = 10
    # Corruption settings by training progress (pretrain/data/stages.py): a list of
    # {until_tokens: N, <corruption setting>: value, ...}; a sample whose progress (tokens of
    # the global sample order before it) is below a stage's until_tokens, and not below the
    # previous stage's, is corrupted with that stage's settings; the last stage has no
    # until_tokens. Empty: the objective's own settings throughout.
    stages: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        require(
            self.masking in ("dynamic", "static"),
            "objective.masking",
            self.masking,
            "must be 'dynamic' or 'static'",
        )
        require(
            self.dupe_factor >= 1, "objective.dupe_factor", self.dupe_factor, "must be at least 1"
        )
        stage_configs(self)  # checks every stage

    def check_data(self, data_format: str) -> None:
        """Cross-check with the run's input format, `data.format` (e.g. a sentence task needs a
        pair format); ConfigError naming the key."""

    @property
    def sentence_task(self) -> str:
        """The sentence-relation task a pair format labels pairs for (nsp, sop, three_way),
        or "none"; objectives with a task (`MaskedLMConfig.pair_task`) say which."""
        return "none"


# Objective settings a stage may not change: what the stream, the model or the loss use.
UNSTAGED_SETTINGS = ("name", "_target_", "masking", "dupe_factor", "stages", "seed", "pair_task")
# What a stage may set besides the corruption: a context-extension phase (checked against the
# run by `pretrain.config.stage_context`): its samples' sequence length, the global layers'
# RoPE theta.
CONTEXT_STAGE_SETTINGS = ("max_seq_length", "global_rope_theta")


def stage_configs(objective: ObjectiveConfig) -> list[tuple[int | None, ObjectiveConfig]]:
    """(until_tokens, the objective's config with the stage's settings) of each of
    `objective.stages` (until_tokens None for the last); [] without stages. Checks that every
    stage but the last has increasing until_tokens, sets only settings of the objective's
    corruption, and that those pass the objective's own checks; errors name
    objective.stages[i].<key>."""
    if not objective.stages:
        return []
    from hydra.utils import get_class

    corruption = get_class(objective._target_).corruption_class
    settable = {f.name for f in fields(objective)} & {f.name for f in fields(corruption)}
    settable -= set(UNSTAGED_SETTINGS)
    staged, previous = [], 0
    for number, stage in enumerate(objective.stages):
        where = f"objective.stages[{number}]"
        require(isinstance(stage, Mapping), where, stage, "must be a mapping of settings")
        settings = {k: v for k, v in stage.items() if k not in CONTEXT_STAGE_SETTINGS}
        until = settings.pop("until_tokens", None)
        if number == len(objective.stages) - 1:
            require(
                until is None,
                f"{where}.until_tokens",
                until,
                "the last stage runs to the end of training: leave its until_tokens out",
            )
        else:
            whole = isinstance(until, int) and not isinstance(until, bool)
            require(
                whole and until > previous,
                f"{where}.until_tokens",
                until,
                f"must be a whole number of tokens above the previous stage's ({previous})",
            )
        unknown = sorted(set(settings) - settable)
        require(
            not unknown,
            f"{where}.{unknown[0] if unknown else ''}",
            settings.get(unknown[0]) if unknown else None,
            f"not a corruption setting of {objective._target_} (a stage sets until_tokens "
            f"and any of: {', '.join(sorted(settable)) or 'none'})",
        )
        try:
            values = OmegaConf.merge(OmegaConf.structured(objective), settings, {"stages": []})
            typed = OmegaConf.to_object(values)
        except OmegaConfBaseException as error:
            raise ConfigError(f"{where}.{error.full_key}: {error.msg}") from error
        except ConfigError as error:
            raise ConfigError(str(error).replace("objective.", f"{where}.", 1)) from error
        staged.append((until, typed))
        previous = until
    return staged


# Input formats (`data.format`) the causal LM and XLNet read; ERNIE's masking units.
CAUSAL_FORMATS = ("full_sentences", "doc_sentences")
XLNET_FORMATS = ("xlnet_pair", "xlnet_memory", "full_sentences", "doc_sentences")
MASKING_LEVELS = ("basic", "phrase", "entity")


def require_replacement_split(config) -> None:
    """Check `config`'s 80/10/10 split: objective.mask_token_probability and
    objective.random_token_probability (shares of the predicted tokens replaced by [MASK] and
    by a random token) each in [0, 1], together at most 1 (the rest stay unchanged)."""
    for key in ("mask_token_probability", "random_token_probability"):
        require_unit_interval(
            f"objective.{key}", getattr(config, key), open_low=False, open_high=False
        )
    total = config.mask_token_probability + config.random_token_probability
    if total > 1 + 1e-9:
        raise ConfigError(
            f"objective.mask_token_probability + objective.random_token_probability = {total!r}: must be at "
            "most 1 (the rest of the selected tokens stay unchanged)"
        )


@dataclass
class MaskedLMConfig(ObjectiveConfig):
    """MLM settings; probabilities of selection per token, of replacement per selected unit."""

    pair_task: str = "nsp"  # sentence-relation task on [CLS]: nsp | sop | none
    mlm_probability: float = 0.15
    mask_token_probability: float = 0.8
    random_token_probability: float = 0.1

    pair_tasks = ("nsp", "sop", "none")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_unit_interval("objective.mlm_probability", self.mlm_probability)
        require_replacement_split(self)
        if self.pair_task not in self.pair_tasks:
            raise ConfigError(
                f"objective.pair_task = {self.pair_task!r}: must be one of {', '.join(self.pair_tasks)}"
            )

    @property
    def sentence_task(self) -> str:
        return self.pair_task

    def check_data(self, data_format: str) -> None:
        from pretrain.data.input_formats import PAIR_FORMATS  # the formats' module: numpy

        if self.pair_task != "none" and data_format not in PAIR_FORMATS:
            raise ConfigError(
                f"objective.pair_task = {self.pair_task!r}: a sentence task needs a pair format "
                f"(data=segment_pair or data=sentence_pair; data.format is {data_format!r}); "
                "use objective=mlm for single-segment formats"
            )


@dataclass
class SpanMaskingConfig(MaskedLMConfig):
    """MLM settings + span lengths (in words) + the SBO's position table size (in tokens)."""

    name: str = "span"
    _target_: str = "pretrain.objectives.span.SpanBert"
    pair_task: str = "none"
    span_geometric_p: float = 0.2  # success probability of the geometric span length (words)
    span_max_words: int = 10  # longer draws are clipped to this many words
    sbo_max_span_tokens: int = 200

    pair_tasks = ("none",)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            0 < self.span_geometric_p <= 1,
            "objective.span_geometric_p",
            self.span_geometric_p,
            "must lie in (0, 1] (the success probability of the geometric span length; SpanBERT uses 0.2)",
        )
        require(
            self.span_max_words >= 1,
            "objective.span_max_words",
            self.span_max_words,
            "must be at least 1 word (SpanBERT truncates span lengths to 1..10)",
        )
        require(
            self.sbo_max_span_tokens >= 1,
            "objective.sbo_max_span_tokens",
            self.sbo_max_span_tokens,
            "must be at least 1 (positions inside longer spans share the last embedding)",
        )

    def check_data(self, data_format: str) -> None:
        from pretrain.data.input_formats import PAIR_FORMATS

        if data_format in PAIR_FORMATS:
            raise ConfigError(
                f"data.format = {data_format!r}: objective=span (SpanBERT) trains on single "
                "segments without a sentence task; use data=full_sentences or data=doc_sentences"
            )


@dataclass
class NgramMaskingConfig(MaskedLMConfig):
    """MLM settings + the longest n-gram, in words."""

    name: str = "ngram"
    _target_: str = "pretrain.objectives.ngram.NgramMaskedLM"
    max_ngram: int = 3  # longest n-gram, in words

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.max_ngram >= 1,
            "objective.max_ngram",
            self.max_ngram,
            "must be at least 1 word (ALBERT uses 3; 1 is whole-word masking)",
        )


@dataclass
class ErnieConfig(MaskedLMConfig):
    """MLM settings + which annotations are masking units (`MASKING_LEVELS`)."""

    name: str = "ernie"
    _target_: str = "pretrain.objectives.ernie.ErnieMaskedLM"
    masking_level: str = "entity"  # units: basic (words) | phrase (+ phrases) | entity (+ entities)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.masking_level in MASKING_LEVELS,
            "objective.masking_level",
            self.masking_level,
            f"must be one of {', '.join(MASKING_LEVELS)} (ERNIE's stages: words; + phrases; "
            "+ entities)",
        )


@dataclass
class StructBertConfig(MaskedLMConfig):
    """MLM settings + the word structural objective's share of tokens in shuffled trigrams;
    the sentence task is three-way by default."""

    name: str = "structbert"
    _target_: str = "pretrain.objectives.structbert.StructBert"
    pair_task: str = "three_way"
    shuffle_probability: float = 0.05

    pair_tasks = ("three_way", "nsp", "sop", "none")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_unit_interval("objective.shuffle_probability", self.shuffle_probability)


@dataclass
class ElectraObjectiveConfig(MaskedLMConfig):
    """ELECTRA's settings. Fractions are of the discriminator's sizes; `temperature` divides
    the generator's logits before sampling; `discriminator_weight` is the paper's lambda."""

    name: str = "electra"
    _target_: str = "pretrain.objectives.electra.ElectraModule"
    pair_task: str = "none"
    mask_token_probability: float = 1.0
    random_token_probability: float = 0.0
    generator_size_fraction: float = 0.25
    generator_layer_fraction: float = 1.0
    discriminator_weight: float = 50.0
    temperature: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.pair_task == "none",
            "objective.pair_task",
            self.pair_task,
            "ELECTRA has no sentence task: must be 'none'",
        )
        for key in ("generator_size_fraction", "generator_layer_fraction"):
            require_unit_interval(f"objective.{key}", getattr(self, key), open_high=False)
        require_positive(self, ("discriminator_weight", "temperature"), group="objective")


@dataclass
class DistillationConfig(MaskedLMConfig):
    """MLM settings plus the teacher (path) and the loss weights; temperature T > 0."""

    name: str = "distillation"
    _target_: str = "pretrain.objectives.distillation.DistillationModule"
    pair_task: str = "none"
    teacher: str | None = None
    temperature: float = 2.0
    alpha_ce: float = 5.0
    alpha_mlm: float = 2.0
    alpha_cos: float = 1.0
    # false: the student keeps its random initialisation (the paper's ablation, Table 4)
    init_from_teacher: bool = True  # false: a random student (the paper's ablation)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.pair_task == "none",
            "objective.pair_task",
            self.pair_task,
            "must be 'none': DistilBERT has no sentence task",
        )
        require(self.temperature > 0, "objective.temperature", self.temperature, "must be positive")
        for key in ("alpha_ce", "alpha_mlm", "alpha_cos"):
            require(getattr(self, key) >= 0, f"objective.{key}", getattr(self, key), "must be >= 0")
        total = self.alpha_ce + self.alpha_mlm + self.alpha_cos
        require(
            total > 0, "objective.alpha_ce", self.alpha_ce, "the three alphas sum to 0: no loss"
        )


@dataclass
class CausalLMConfig(ObjectiveConfig):
    """Causal LM settings: none of its own beyond the objective's name."""

    name: str = "causal_lm"
    _target_: str = "pretrain.objectives.causal_lm.CausalLanguageModel"
    dupe_factor: int = 1  # nothing is masked: masking and dupe_factor have no effect

    def check_data(self, data_format: str) -> None:
        if data_format not in CAUSAL_FORMATS:
            raise ConfigError(
                f"data.format = {data_format!r}: the causal LM reads single-segment sequences; "
                "use data=full_sentences (GPT-2 style packing) or data=doc_sentences"
            )


@dataclass
class PermutationLMConfig(ObjectiveConfig):
    """`partial_prediction_k`: K, 1/K of each sequence's candidate tokens are predicted;
    `order`: "uniform" (the paper) or "span" (targets in spans of 1..max_span_length tokens,
    the released code / HF's collator); `memory_random_b_probability`: with
    data.format=xlnet_memory, how often segment B is text of another document instead of A's
    continuation (XLNet's data_utils.py: 0.5; 0 = B always continues A)."""

    name: str = "xlnet"
    _target_: str = "pretrain.objectives.xlnet.PermutationLanguageModel"
    partial_prediction_k: float = 6.0
    order: str = "uniform"
    max_span_length: int = 5
    memory_random_b_probability: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.partial_prediction_k >= 1,
            "objective.partial_prediction_k",
            self.partial_prediction_k,
            "must be at least 1 (1 = predict every token)",
        )
        from pretrain.data.permutation import ORDERS  # numpy, no torch

        require(self.order in ORDERS, "objective.order", self.order, f"must be one of {ORDERS}")
        require(
            self.max_span_length >= 1,
            "objective.max_span_length",
            self.max_span_length,
            "must be at least 1 token",
        )
        require_unit_interval(
            "objective.memory_random_b_probability",
            self.memory_random_b_probability,
            open_low=False,
            open_high=False,
        )

    def check_data(self, data_format: str) -> None:
        if data_format not in XLNET_FORMATS:
            raise ConfigError(
                f"data.format = {data_format!r}: XLNet needs one of {', '.join(XLNET_FORMATS)} "
                "(xlnet_pair: A [SEP] B [SEP] [CLS] as in the paper; xlnet_memory: the same with "
                "a memory carried across batches)"
            )


@dataclass
class Seq2SeqObjectiveConfig(ObjectiveConfig):
    """What every encoder-decoder objective has: label smoothing of the target distribution."""

    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        require_probabilities(self, ("label_smoothing",), group="objective")


@dataclass
class DenoisingConfig(Seq2SeqObjectiveConfig):
    """BART's noise: fractions of the body's tokens (masking, deletion, infilling), fraction
    of sentences shuffled (permutation), probability of rotating (rotation)."""

    name: str = "bart"
    _target_: str = "pretrain.objectives.denoising.DenoisingAutoencoder"
    token_masking: float = 0.0
    token_deletion: float = 0.0
    text_infilling: float = 0.3
    poisson_lambda: float = 3.0  # mean span length of text infilling, in tokens
    sentence_permutation: float = 1.0
    document_rotation: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        require_probabilities(
            self, ("token_masking", "token_deletion", "text_infilling"), group="objective"
        )
        for key in ("sentence_permutation", "document_rotation"):
            require_unit_interval(
                f"objective.{key}", getattr(self, key), open_low=False, open_high=False
            )
        require(
            self.poisson_lambda > 0,
            "objective.poisson_lambda",
            self.poisson_lambda,
            "must be positive (mean span length in tokens)",
        )


@dataclass
class MassConfig(Seq2SeqObjectiveConfig):
    """MASS settings: the fragment's share of the body's tokens; the shares of the fragment's
    encoder tokens replaced by [MASK] and by a random token (the rest stay unchanged)."""

    name: str = "mass"
    _target_: str = "pretrain.objectives.mass.MaskedSeq2Seq"
    fragment_fraction: float = 0.5
    mask_token_probability: float = 0.8
    random_token_probability: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        require_unit_interval("objective.fragment_fraction", self.fragment_fraction)
        require_replacement_split(self)


# The schema of each objective's yaml, `conf/objective/<name>.yaml`, which names it first in
# its defaults list (`/schema/objective/<name>@_here_`) and gives only the values that differ.
# the formats whose token types mark a source segment (0) and a target segment (1)
UNILM_FORMATS = ("segment_pair", "sentence_pair")


@dataclass
class UniLMConfig(MaskedLMConfig):
    """UniLM's settings: MLM's (15%, 80/10/10) and the relative weights of the four kinds
    (the paper's 2 : 1 : 1 : 2, i.e. 1/3 bidirectional, 1/6 each direction, 1/3 seq2seq)."""

    name: str = "unilm"
    _target_: str = "pretrain.objectives.unilm.UniLM"
    pair_task: str = "none"
    bidirectional_weight: float = 2.0
    left_to_right_weight: float = 1.0
    right_to_left_weight: float = 1.0
    seq2seq_weight: float = 2.0

    pair_tasks = ("none",)  # B must be A's continuation: seq2seq learns to write it

    def __post_init__(self) -> None:
        super().__post_init__()
        for kind in ("bidirectional", "left_to_right", "right_to_left", "seq2seq"):
            key = f"{kind}_weight"
            require(getattr(self, key) >= 0, f"objective.{key}", getattr(self, key), "must be >= 0")
        total = sum(self.lm_kind_weights)
        require(total > 0, "objective.*_weight", total, "the four weights must not all be 0")

    @property
    def lm_kind_weights(self) -> tuple[float, float, float, float]:
        """The weights in kind-code order (`pretrain.data.lm_kinds`)."""
        return (
            self.bidirectional_weight,
            self.left_to_right_weight,
            self.right_to_left_weight,
            self.seq2seq_weight,
        )

    def check_data(self, data_format: str) -> None:
        if data_format not in UNILM_FORMATS:
            raise ConfigError(
                f"data.format = {data_format!r}: UniLM's seq2seq LM needs a source and a target "
                f"segment; use data=segment_pair or data=sentence_pair"
            )


OBJECTIVE_SCHEMAS: dict[str, type[ObjectiveConfig]] = {
    "mlm_nsp": MaskedLMConfig,
    "span": SpanMaskingConfig,
    "ngram": NgramMaskingConfig,
    "ernie": ErnieConfig,
    "structbert": StructBertConfig,
    "electra": ElectraObjectiveConfig,
    "distillation": DistillationConfig,
    "causal_lm": CausalLMConfig,
    "xlnet": PermutationLMConfig,
    "bart": DenoisingConfig,
    "mass": MassConfig,
    "unilm": UniLMConfig,
}
