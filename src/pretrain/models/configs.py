"""The settings of every model family: one dataclass per family (its encoder class's
`config_class`), registered in Hydra's ConfigStore as `schema/model/<family>` so that
`conf/model/*.yaml` start from it and give only the sizes that differ. Torch-free: `pretrain`
checks these values before torch loads. Sizes in features, layers and heads; a default is
written here once.
"""

from dataclasses import dataclass

from pretrain.errors import (
    ConfigError,
    require,
    require_choice,
    require_divisible,
    require_encoder_sizes,
    require_positive,
    require_probabilities,
)

KERNEL_IMPLS = (
    "auto",
    "torch",
    "apex",
)  # optim.impl, model.layer_norm_impl (pretrain.runtime.kernels)
# The activations each family's modules implement (a unit test checks the modules' tables).
BERT_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")  # models/heads.py
GLU_ACTIVATIONS = ("gelu", "silu")  # ModernBERT's GeGLU, NeoBERT's SwiGLU
XLNET_ACTIVATIONS = ("gelu", "relu", "gelu_new")
SEQ2SEQ_ACTIVATIONS = ("relu", "gelu")
SHARE_MODES = ("all", "attention", "ffn", "none")  # ALBERT's cross-layer sharing
NORMS = ("layer_norm", "rms_norm")
ATTENTION_BACKENDS = ("auto", "flex", "sdpa")  # models/document_attention.py
POSITION_EMBEDDINGS = ("sinusoidal", "learned")
POSITION_OFFSET = 2  # RoBERTa's positions start past the padding index
DISTILBERT_LAYER_NORM_EPS = 1e-12


@dataclass
class ModelConfig:
    """What every model config has. Each model class subclasses it with its sizes (its
    `config_class`, e.g. `BertEncoderConfig`), checked when the run config is validated."""

    name: str = "bert_tiny"
    _target_: str = "pretrain.models.bert.BertEncoder"
    # Vocabulary size (tokens) of the paper's tokenizer: used by `pretrain-params` and the
    # parameter-count checks; training takes the size of the run's own tokenizer.
    reference_vocab_size: int | None = None
    # LayerNorm kernels: auto (apex's FusedLayerNorm on CUDA when apex is installed, else
    # torch's) | torch | apex (an error where apex cannot run); see pretrain/runtime/kernels.py.
    layer_norm_impl: str = "auto"
    # The unpadded encoder path (BERT family; pretrain/models/unpadding.py): dense layers on
    # the real tokens only. auto (unpadded on CUDA when a batch has padding to drop, padded
    # on the CPU) | true | false; the same outputs either way (dropout draws other masks).
    unpad: str = "auto"

    def __post_init__(self) -> None:
        require(
            self.reference_vocab_size is None or self.reference_vocab_size > 0,
            "model.reference_vocab_size",
            self.reference_vocab_size,
            "must be positive or null",
        )
        require(
            self.layer_norm_impl in KERNEL_IMPLS,
            "model.layer_norm_impl",
            self.layer_norm_impl,
            f"must be one of {', '.join(KERNEL_IMPLS)}",
        )
        self.unpad = str(self.unpad).lower()  # a YAML true/false arrives as a bool
        require(
            self.unpad in ("auto", "true", "false"),
            "model.unpad",
            self.unpad,
            "must be auto, true or false",
        )

    @property
    def attends_by_document(self) -> bool:
        """Whether the model takes packed rows' `document_ids` and keeps attention within a
        document (`data.document_masks`); ModernBERT's family does."""
        return False

    @property
    def head_activation(self) -> str:
        """The activation of the MLM head's transform: exact GELU; a family with its own
        (ALBERT's `hidden_act`) says so."""
        return "gelu"

    @property
    def head_bias(self) -> bool:
        """Whether the MLM head's transform (dense, LayerNorm) has biases: yes but in
        families without biases (ModernBERT)."""
        return True

    @property
    def max_sequence_tokens(self) -> int | None:
        """The longest input the model accepts (tokens), or None when unbounded."""
        return getattr(self, "max_position_embeddings", None)


@dataclass
class BertEncoderConfig(ModelConfig):
    """A BERT encoder's settings (BertConfig's names); sizes in features, layers and heads."""

    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        super().__post_init__()
        require_encoder_sizes(self, "type_vocab_size")
        require_probabilities(self, ("hidden_dropout_prob", "attention_probs_dropout_prob"))


@dataclass
class RobertaEncoderConfig(BertEncoderConfig):
    """RoBERTa's settings (RobertaConfig's names, the same as BERT's); sizes in features."""

    name: str = "roberta_tiny"
    _target_: str = "pretrain.models.roberta.RobertaEncoder"

    max_position_embeddings: int = 514
    type_vocab_size: int = 1
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.max_position_embeddings > POSITION_OFFSET,
            "model.max_position_embeddings",
            self.max_position_embeddings,
            f"must exceed {POSITION_OFFSET}: RoBERTa's positions start past the padding index",
        )

    @property
    def max_sequence_tokens(self) -> int:
        """Tokens per sequence: max_position_embeddings - 2 (512 for 514), the rows below the
        first position being the padding index and the one before it, as with RoBERTa's pad id 1."""
        return self.max_position_embeddings - POSITION_OFFSET


@dataclass
class ElectraEncoderConfig(BertEncoderConfig):
    """An ELECTRA encoder's settings (ElectraConfig's names): BERT's, plus the embedding width
    `embedding_size` (features; equal to hidden_size for ELECTRA-base/large)."""

    _target_: str = "pretrain.models.electra.ElectraEncoder"
    embedding_size: int = 128

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, ("embedding_size",))


@dataclass
class AlbertEncoderConfig(BertEncoderConfig):
    """An ALBERT encoder's settings (AlbertConfig's names): BERT's, with ALBERT's defaults,
    plus `embedding_size`, `share_layers` and `hidden_act`; sizes in features (embedding_size
    E, hidden_size H, intermediate_size), layers and heads."""

    name: str = "albert_tiny"
    _target_: str = "pretrain.models.albert.AlbertEncoder"

    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    embedding_size: int = 128
    share_layers: str = "all"
    hidden_act: str = "gelu_new"

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, ("embedding_size",))
        require_choice(self, "share_layers", SHARE_MODES)
        require_choice(self, "hidden_act", BERT_ACTIVATIONS)

    @property
    def head_activation(self) -> str:
        return self.hidden_act


@dataclass
class DistilBertEncoderConfig(ModelConfig):
    """DistilBERT's settings under BERT's names (dim = hidden_size, n_layers =
    num_hidden_layers, hidden_dim = intermediate_size ...); sizes in features, layers, heads."""

    name: str = "distilbert"
    _target_: str = "pretrain.models.distilbert.DistilBertEncoder"

    hidden_size: int = 768
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    layer_norm_eps: float = DISTILBERT_LAYER_NORM_EPS
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        super().__post_init__()
        require_encoder_sizes(self)
        require_probabilities(self, ("hidden_dropout_prob", "attention_probs_dropout_prob"))
        require(
            self.layer_norm_eps == DISTILBERT_LAYER_NORM_EPS,
            "model.layer_norm_eps",
            self.layer_norm_eps,
            "must be 1e-12: DistilBERT (and its Hugging Face export) fixes it",
        )


@dataclass
class ModernBertEncoderConfig(ModelConfig):
    """A ModernBERT encoder's settings (ModernBertConfig's names where it has them); sizes
    in features, layers and heads, windows and positions in tokens."""

    name: str = "modernbert_tiny"
    _target_: str = "pretrain.models.modernbert.ModernBertEncoder"

    hidden_size: int = 128
    num_hidden_layers: int = 3
    num_attention_heads: int = 2
    intermediate_size: int = 192  # each of the gated feed-forward's two halves
    max_position_embeddings: int = 8192  # the longest input (tokens); RoPE has no table
    hidden_activation: str = "gelu"  # gelu: GeGLU | silu: SwiGLU
    norm: str = "layer_norm"  # layer_norm (no bias) | rms_norm
    norm_eps: float = 1e-5
    embedding_norm: bool = True  # a norm after the embeddings (the first block has none then)
    local_attention: int = 128  # sliding window of the local layers (tokens, both sides)
    global_attn_every_n_layers: int = 3  # 1: every layer global
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    embedding_dropout: float = 0.0
    attention_dropout: float = 0.0
    mlp_dropout: float = 0.0
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0  # weights ~ normal truncated at this many stds
    attention_backend: str = "auto"  # auto (flex on CUDA) | flex | sdpa

    def __post_init__(self) -> None:
        super().__post_init__()
        require_encoder_sizes(self, "local_attention", "global_attn_every_n_layers")
        require_probabilities(self, ("embedding_dropout", "attention_dropout", "mlp_dropout"))
        for key, allowed in (
            ("hidden_activation", GLU_ACTIVATIONS),
            ("norm", NORMS),
            ("attention_backend", ATTENTION_BACKENDS),
        ):
            if getattr(self, key) not in allowed:
                raise ConfigError(
                    f"model.{key} = {getattr(self, key)!r}: must be one of {', '.join(allowed)}"
                )

    @property
    def attends_by_document(self) -> bool:
        """Packed rows' document_ids keep attention within a document (data.document_masks)."""
        return True

    @property
    def layer_norm_eps(self) -> float:
        """The MLM head's LayerNorm eps: the model's norm_eps."""
        return self.norm_eps

    @property
    def head_bias(self) -> bool:
        """ModernBERT's MLM head transform has no biases (its decoder has one)."""
        return False


@dataclass
class XLNetEncoderConfig(ModelConfig):
    """XLNet's settings (XLNetConfig's names); sizes in features, layers and heads; lengths in
    tokens. `mem_len`: tokens of memory kept per layer (null or 0: no memory); `reuse_len`:
    tokens at the start of each segment that go into the memory (null: all); `bi_data`: XLNet's
    bidirectional data, the second half of every batch is text read backward and gets
    backward relative positions (HF's XLNetConfig.bi_data; pretraining with
    data.format=xlnet_memory only, batches of an even size)."""

    name: str = "xlnet_tiny"
    _target_: str = "pretrain.models.xlnet.XLNetEncoder"
    d_model: int = 64
    n_layer: int = 2
    n_head: int = 2
    d_inner: int = 256
    ff_activation: str = "gelu"
    attn_type: str = "bi"
    mem_len: int | None = None
    reuse_len: int | None = None
    bi_data: bool = False
    clamp_len: int = -1
    dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, ("d_model", "n_layer", "n_head", "d_inner"))
        require_divisible(self, "d_model", "n_head")
        require_choice(self, "ff_activation", XLNET_ACTIVATIONS)
        require(
            self.attn_type == "bi",
            "model.attn_type",
            self.attn_type,
            "only 'bi' (bidirectional, XLNet pretraining) is implemented",
        )
        for key in ("mem_len", "reuse_len"):
            value = getattr(self, key)
            require(value is None or value >= 0, f"model.{key}", value, "must be >= 0 or null")
        require_probabilities(self, ("dropout",))

    @property
    def max_sequence_tokens(self) -> int | None:
        """Relative positions: no limit on the input length."""
        return None


@dataclass
class GPTConfig(ModelConfig):
    """A GPT-2 model's settings (GPT2Config's names); sizes in features, layers and heads.
    `n_inner` null means 4 x n_embd; dropouts are probabilities."""

    name: str = "gpt_tiny"
    _target_: str = "pretrain.models.gpt.GPTModel"
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_inner: int | None = None
    n_positions: int = 128
    resid_pdrop: float = 0.1
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, ("n_embd", "n_layer", "n_head", "n_positions"))
        require(
            self.n_inner is None or self.n_inner > 0,
            "model.n_inner",
            self.n_inner,
            "must be positive or null (4 x model.n_embd)",
        )
        require_divisible(self, "n_embd", "n_head")
        require_probabilities(self, ("resid_pdrop", "embd_pdrop", "attn_pdrop"))
        require_positive(self, ("layer_norm_epsilon",))

    @property
    def max_sequence_tokens(self) -> int | None:
        return self.n_positions


@dataclass
class EncoderDecoderConfig(ModelConfig):
    """An encoder-decoder's settings (BartConfig's names); sizes in features, layers, heads."""

    name: str = "bart_tiny"
    _target_: str = "pretrain.models.seq2seq.EncoderDecoder"
    d_model: int = 64
    encoder_layers: int = 2
    decoder_layers: int = 2
    encoder_attention_heads: int = 2
    decoder_attention_heads: int = 2
    encoder_ffn_dim: int = 256
    decoder_ffn_dim: int = 256
    max_position_embeddings: int = 512
    position_embedding: str = "learned"
    activation: str = "gelu"
    scale_embedding: bool = False
    layernorm_embedding: bool = True
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    layer_norm_eps: float = 1e-5
    init_std: float = 0.02

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(
            self,
            (
                "d_model",
                "encoder_layers",
                "decoder_layers",
                "encoder_attention_heads",
                "decoder_attention_heads",
                "encoder_ffn_dim",
                "decoder_ffn_dim",
                "max_position_embeddings",
            ),
        )
        require_divisible(self, "d_model", "encoder_attention_heads")
        require_divisible(self, "d_model", "decoder_attention_heads")
        require_choice(self, "position_embedding", POSITION_EMBEDDINGS)
        require_choice(self, "activation", SEQ2SEQ_ACTIVATIONS)
        require_probabilities(self, ("dropout", "attention_dropout", "activation_dropout"))


# The schema of each family, by the name its yamls give in their defaults list
# (`/schema/model/<family>@_here_`).
MODEL_SCHEMAS: dict[str, type[ModelConfig]] = {
    "bert": BertEncoderConfig,
    "roberta": RobertaEncoderConfig,
    "electra": ElectraEncoderConfig,
    "albert": AlbertEncoderConfig,
    "distilbert": DistilBertEncoderConfig,
    "modernbert": ModernBertEncoderConfig,
    "xlnet": XLNetEncoderConfig,
    "gpt": GPTConfig,
    "seq2seq": EncoderDecoderConfig,
}
