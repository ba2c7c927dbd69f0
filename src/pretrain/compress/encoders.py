"""A BERT-family encoder with its MLM head, read from a `pretrain` checkpoint or a Hugging
Face export, and written back as a Hugging Face directory: what every compression method
starts from and ends with."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from pretrain.compress.trace import EncoderTrace, trace_encoder
from pretrain.data.vocab import Vocabulary, load_vocabulary
from pretrain.errors import ConfigError
from pretrain.models.bert import BertEncoder, BertLayer
from pretrain.models.build import build_encoder
from pretrain.models.heads import MaskedLMHead


class EncoderWithMLM(nn.Module):
    """A BERT-family encoder (`model` config group) and its tied MLM head:
    (batch, seq) ids -> (batch, seq, hidden) states, `logits` -> (..., vocab)."""

    def __init__(self, model_cfg: dict[str, Any], vocab: Vocabulary) -> None:
        super().__init__()
        self.model_cfg = dict(model_cfg)
        self.encoder = build_encoder(model_cfg, vocab.size, vocab.pad)
        if not isinstance(self.encoder, BertEncoder) or not all(
            isinstance(layer, BertLayer) for layer in self.encoder.layers
        ):
            raise ConfigError(
                f"model._target_ = {model_cfg.get('_target_')!r}: compression needs a BERT-style "
                "encoder (BERT, RoBERTa, ELECTRA's discriminator), one BertLayer per layer"
            )
        self.encoder.unpad = "false"  # the layer-wise traces read the padded (batch, seq) grid
        self.mlm_head = MaskedLMHead(
            model_cfg["hidden_size"],
            vocab.size,
            model_cfg["layer_norm_eps"],
            self.encoder.word_embeddings,
            initializer_range=model_cfg.get("initializer_range", 0.02),
        )

    def forward(
        self, input_ids: Tensor, token_type_ids: Tensor | None, attention_mask: Tensor | None
    ) -> Tensor:
        """(batch, seq) ids, types and mask (1 = real) -> (batch, seq, vocab) MLM logits."""
        return self.mlm_head(self.encoder(input_ids, token_type_ids, attention_mask))

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.encoder.word_embeddings

    def trace(
        self, input_ids: Tensor, token_type_ids: Tensor | None, attention_mask: Tensor | None
    ) -> EncoderTrace:
        """The layer-wise trace of the encoder (pretrain.compress.trace.trace_encoder)."""
        return trace_encoder(self.encoder, input_ids, token_type_ids, attention_mask)

    def mlm_logits(self, hidden: Tensor) -> Tensor:
        """(..., hidden) last-layer states -> (..., vocab) MLM logits."""
        return self.mlm_head(hidden)


def build_student(model_cfg: dict[str, Any], vocab: Vocabulary) -> nn.Module:
    """The student of `model_cfg` (conf/compress/student/): a MobileBertWithMLM when its
    `_target_` names that class, else an EncoderWithMLM of the `model` group's encoder."""
    if str(model_cfg.get("_target_", "")).endswith(".MobileBertWithMLM"):
        from pretrain.compress.mobilebert import MobileBertWithMLM

        return MobileBertWithMLM(model_cfg, vocab)
    return EncoderWithMLM(model_cfg, vocab)


@dataclass
class LoadedModel:
    """A model read for compression: `model` (encoder + MLM head), its `model` config group,
    the tokenizer directory it was trained with, its vocabulary, and where it came from."""

    model: EncoderWithMLM
    model_cfg: dict[str, Any]
    tokenizer_dir: Path
    vocab: Vocabulary
    source: str
    has_mlm_head: bool


def read_weights(source: str | Path) -> tuple[dict[str, Any], dict[str, Tensor], Path]:
    """(model config group, state_dict under our names, tokenizer directory) of a `pretrain`
    checkpoint (.ckpt or ZeRO directory) or a Hugging Face directory (`pretrain-export`'s)."""
    from pretrain.export import import_hf_model, read_checkpoint

    path = Path(source)
    if path.is_dir() and (path / "config.json").is_file():
        model_cfg, state_dict = import_hf_model(path)
        return model_cfg, state_dict, path
    if path.exists():
        state_dict, config = read_checkpoint(path)
        return dict(config["model"]), state_dict, Path(config["data"]["tokenizer_dir"])
    raise ConfigError(
        "no such file or directory; give a `pretrain` .ckpt or a Hugging Face directory "
        "written by pretrain-export"
    )


def load_model(source: str | Path, key: str = "teacher") -> LoadedModel:
    """Load `source` (see `read_weights`) in eval mode; `key` names the config key in errors.
    The MLM head keeps its initialisation when the weights have none (`has_mlm_head` False)."""
    from pretrain.export import ExportError

    try:
        model_cfg, state_dict, tokenizer_dir = read_weights(source)
        vocab = load_vocabulary(tokenizer_dir)
    except (ExportError, ValueError) as error:
        raise ConfigError(f"{key}={source}: {error}") from None
    model = EncoderWithMLM(model_cfg, vocab)
    weights = {k: v for k, v in state_dict.items() if k.startswith(("encoder.", "mlm_head."))}
    rows = weights["encoder.embeddings.word_embeddings.weight"].shape[0]
    if rows != vocab.size:
        raise ConfigError(
            f"{key}={source}: the weights have {rows} tokens but its tokenizer ({tokenizer_dir}) "
            f"has {vocab.size}; give the tokenizer the model was trained with"
        )
    has_head = "mlm_head.bias" in weights
    if has_head:
        weights["mlm_head.decoder.weight"] = weights["encoder.embeddings.word_embeddings.weight"]
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [name for name in missing if has_head or not name.startswith("mlm_head.")]
    if missing or unexpected:
        raise ConfigError(
            f"{key}={source}: the weights do not fit its model config (missing "
            f"{missing[:3]}, unexpected {unexpected[:3]})"
        )
    model.eval()
    return LoadedModel(model, model_cfg, Path(tokenizer_dir), vocab, str(source), has_head)


def tokenizer_vocabulary(tokenizer_dir: str | Path) -> dict[str, int]:
    """The token -> id map of `<tokenizer_dir>/tokenizer.json`."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json")).get_vocab()


def require_same_tokenizer(teacher: LoadedModel, tokenizer_dir: str | Path, key: str) -> None:
    """Raise ConfigError unless the teacher's tokenizer maps every token to the same id as
    the one at `tokenizer_dir` (the corpus's, a student's): distillation compares
    predictions token for token."""
    ours, theirs = tokenizer_vocabulary(tokenizer_dir), tokenizer_vocabulary(teacher.tokenizer_dir)
    if ours != theirs:
        differing = sorted(set(ours.items()) ^ set(theirs.items()))[:1]
        raise ConfigError(
            f"{key}={teacher.source}: its tokenizer ({teacher.tokenizer_dir}) is not the one of "
            f"{tokenizer_dir} ({len(theirs)} vs {len(ours)} tokens; e.g. {differing}); distil "
            "with the corpus the teacher was trained on"
        )


def checkpoint_dict(model: EncoderWithMLM, tokenizer_dir: Path, vocab: Vocabulary) -> dict:
    """A `pretrain`-format checkpoint dict of `model` (state_dict + the config keys that
    export and evaluation read), so `pretrain-export` and `pretrain-eval` take it."""
    state_dict = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return {
        "state_dict": state_dict,
        "config": {
            "model": dict(model.model_cfg),
            "model_runtime": {"vocab_size": vocab.size, "pad_token_id": vocab.pad},
            "data": {"tokenizer_dir": str(Path(tokenizer_dir).resolve())},
            "objective": {"_target_": "pretrain.objectives.mlm.MaskedLanguageModel"},
        },
    }


def write_hf_directory(
    model: nn.Module,
    tokenizer_dir: Path,
    vocab: Vocabulary,
    out_dir: str | Path,
    extra_config: dict[str, Any] | None = None,
) -> Path:
    """Write `model` as a Hugging Face directory (config.json with `extra_config` merged in,
    model.safetensors, the tokenizer files) at `out_dir`, replacing it; returns it. Loads with
    `transformers.AutoModelForMaskedLM.from_pretrained`. `model` is an EncoderWithMLM or a
    MobileBertWithMLM (written as transformers' MobileBertForMaskedLM)."""
    import shutil

    from pretrain.export.hf import family_module, write_hf_model

    if hasattr(model, "to_hf"):
        hf_model = model.to_hf()
    else:
        checkpoint = checkpoint_dict(model, tokenizer_dir, vocab)
        family = family_module(model.model_cfg)
        hf_model = family.to_hf(checkpoint["state_dict"], checkpoint["config"])
    hf_model.config.update(extra_config or {})
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    write_hf_model(hf_model, out, tokenizer_dir)
    return out
