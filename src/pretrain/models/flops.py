"""The model FLOP count of a training step, per family, and the device peaks MFU is taken
against.

Model FLOPs count the matrix products a step needs, 2 FLOPs per multiply-add, on the real
(non-padding) tokens only: what the model must compute, not what padding or recomputation
adds. Element-wise work (GELU, softmax, LayerNorm, dropout) and embedding look-ups are left
out. For one transformer block (hidden h, feed-forward width i) applied to a sequence of L
real tokens, the forward pass costs

    dense:     2 L (4 h^2 + 2 h i)     query, key, value and output projections, feed-forward
    attention: 4 h L^2                 scores (Q K^T) and the weighted sum of values

and heads cost 2 x rows x in x out per Linear, on the rows where they run: BERT's MLM head
(h -> E, E -> vocabulary) on the predicted positions of the batch's static prediction budget
(the sparse head), the NSP/SOP head (pooler h -> h, h -> labels) on one row a sequence,
ELECTRA's generator (its own encoder and MLM head) plus the discriminator (the encoder and
an h -> h -> 1 head on every token), GPT's tied LM head on every position, and for an
encoder-decoder (BART, MASS, the Transformer) the encoder on the source, the decoder's self-
and cross-attention (4 d Ls Lt) and feed-forward on the target and the LM head on the
predicted slots; XLNet's two streams on the padded shape (`xlnet_flops`: relative positions,
segments, the query stream's mapping, the last content stream without backward, within 3% of
a count of its matmuls). A factorised embedding (ALBERT, ELECTRA-small: E != h) adds 2 L E h. The
backward pass of a trained part costs twice its forward pass (gradients of the inputs and of
the weights), so a step costs 3 x forward; distillation's frozen teacher adds its forward
pass once.

The step's FLOPs are device tensors built from the batch's shapes and attention mask: they
are summed over the micro-batches and read only at log steps, never a host synchronisation
per step. An objective without a formula (its `forward_flops` returns None) falls back to
the 6N rule: 6 FLOPs per trainable parameter and real token.
"""

from collections.abc import Mapping
from typing import Any

import torch

from pretrain.models.configs import ModelConfig

# A model config, typed or as a checkpoint stores it; a count of tokens (or pairs, rows): a
# number, or a 0-d tensor on the device (read back only on log steps).
ModelSettings = ModelConfig | Mapping[str, Any]
Count = torch.Tensor | int

# Dense peak of one device, TFLOP/s, by GPU name fragment (torch.cuda.get_device_name) and
# precision: NVIDIA's data sheets (SXM parts; dense, no sparsity). fp32 is the plain FP32 rate,
# tf32 the tensor-core rate that `torch.backends.cuda.matmul.allow_tf32` gives 32-true runs.
DEVICE_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 66.9},
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2},
    "H100": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 66.9},
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "A10G": {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2},
    "L40S": {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6},
    "L4": {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "V100": {"bf16": 0.0, "fp16": 125.0, "tf32": 0.0, "fp32": 15.7},
    "T4": {"bf16": 0.0, "fp16": 65.0, "tf32": 0.0, "fp32": 8.1},
}


def block_flops(hidden: int, intermediate: int, tokens: Count, attention_pairs: Count) -> Any:
    """Forward FLOPs of one transformer block: `tokens` real tokens, `attention_pairs` the
    (query, key) pairs attended (sum of L^2 over the sequences); scalars or tensors."""
    return 2 * tokens * (4 * hidden * hidden + 2 * hidden * intermediate) + (
        4 * hidden * attention_pairs
    )


def encoder_flops(model: ModelSettings, tokens: Count, attention_pairs: Count) -> Any:
    """Forward FLOPs of a BERT-family encoder (BERT, RoBERTa, ALBERT, DistilBERT, ELECTRA) on
    `tokens` real tokens: the E -> h embedding projection when E != h, and every layer (an
    ALBERT layer shared n times counts n times). `model`: its config (mapping or dataclass)."""
    hidden, embedding = setting(model, "hidden_size"), embedding_size(model)
    projection = 2 * tokens * embedding * hidden if embedding != hidden else 0
    layers = setting(model, "num_hidden_layers")
    return projection + layers * block_flops(
        hidden, setting(model, "intermediate_size"), tokens, attention_pairs
    )


def mlm_head_flops(hidden: int, embedding: int, vocab_size: int, rows: Count) -> Any:
    """Forward FLOPs of BERT's MLM head on `rows` positions: h -> E transform, E -> vocab."""
    return 2 * rows * (hidden * embedding + embedding * vocab_size)


def bert_family(model: ModelSettings) -> bool:
    """True for a config `encoder_flops` knows (BERT-style layer sizes)."""
    keys = ("hidden_size", "num_hidden_layers", "intermediate_size")
    if isinstance(model, Mapping):
        return all(key in model for key in keys)
    return all(hasattr(model, key) for key in keys)


def gpt_flops(
    model: ModelSettings, tokens: Count, attention_pairs: Count, lm_rows: int, vocab_size: int
) -> Any:
    """Forward FLOPs of a GPT model (n_embd, n_layer, n_inner = 4 n_embd by default) on
    `tokens` real tokens and its tied LM head (n_embd -> vocab) on `lm_rows` positions; the
    causal mask's skipped half of the scores is counted, as PaLM's MFU does."""
    hidden = setting(model, "n_embd")
    inner = setting(model, "n_inner") or 4 * hidden
    blocks = setting(model, "n_layer") * block_flops(hidden, inner, tokens, attention_pairs)
    return blocks + 2 * lm_rows * hidden * vocab_size


def seq2seq_flops(
    model: ModelSettings, source: torch.Tensor, target: torch.Tensor, lm_rows: int, vocab_size: int
) -> torch.Tensor:
    """Forward FLOPs of an encoder-decoder (BART, MASS, the Transformer: d_model, encoder_/
    decoder_layers, encoder_/decoder_ffn_dim) on sources and targets of (batch,) real lengths
    `source`, `target`: encoder blocks on the source; per decoder block, self-attention on the
    target, cross-attention (queries and output on the target, keys and values on the source,
    4 d Ls Lt for the scores and sum) and the feed-forward; the tied LM head on `lm_rows`."""
    d = setting(model, "d_model")
    src, tgt = source.sum(), target.sum()
    encoder = setting(model, "encoder_layers") * block_flops(
        d, setting(model, "encoder_ffn_dim"), src, (source * source).sum()
    )
    self_attention = block_flops(d, setting(model, "decoder_ffn_dim"), tgt, (target * target).sum())
    cross_attention = 2 * (tgt + src) * 2 * d * d + 4 * d * (source * target).sum()
    decoder = setting(model, "decoder_layers") * (self_attention + cross_attention)
    return encoder + decoder + 2 * lm_rows * d * vocab_size


def xlnet_flops(
    model: ModelSettings, batch: int, qlen: int, mlen: int, predict: int, vocab_size: int
) -> float:
    """Forward FLOPs of XLNet (d_model, n_layer, n_head, d_inner) on `batch` rows of `qlen`
    positions (the padded shape: relative attention runs on it), `mlen` memory slots and
    `predict` query-stream positions a row. Per layer: the content stream's projections
    (keys and values over mlen + qlen, queries and output over qlen), relative positions
    (2 x klen of them projected), the scores against content, positions and segments and the
    weighted sum; the query stream's projections on its `predict` rows, its one-hot mapping to
    and from the qlen positions and its attention over them; the feed-forward on both streams;
    then the tied LM head on the predictions. Returned as the forward pass's FLOPs less two
    thirds of the last layer's content-stream queries, attention, output and feed-forward: no
    loss reads them, so they have no backward (a step counts 3 x forward)."""
    d, heads, inner = (setting(model, key) for key in ("d_model", "n_head", "d_inner"))
    klen = mlen + qlen
    relative = (klen + qlen) * (2 if setting(model, "bi_data") else 1)
    attend = 2 * batch * qlen * (d * (2 * klen + klen + qlen + 2) + 2 * klen * heads)
    content = 2 * batch * d * d * (2 * klen + 2 * qlen) + 2 * relative * d * d + attend
    query = 2 * batch * predict * (2 * d * d + 2 * qlen * d) + attend if predict else 0
    feed_forward = 4 * batch * (qlen + predict) * d * inner
    layers = setting(model, "n_layer") * (content + query + feed_forward)
    unread = 2 * batch * qlen * (2 * d * d + 2 * d * inner) + attend  # the last content stream's
    return layers + 2 * batch * predict * d * vocab_size - 2 * unread / 3


def sentence_head_flops(hidden: int, labels: int, sequences: Count) -> Any:
    """Forward FLOPs of the NSP/SOP head on `sequences` [CLS] rows: pooler, classifier."""
    return 2 * sequences * (hidden * hidden + hidden * labels)


def sequence_sizes(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(real tokens, attention pairs = sum of L^2) of a (batch, seq) 1/0 mask, device tensors."""
    lengths = attention_mask.sum(dim=1, dtype=torch.float32)  # (batch,) float: no overflow
    return lengths.sum(), (lengths * lengths).sum()


def setting(model: ModelSettings, key: str) -> Any:
    """A model config value from a mapping or a dataclass."""
    return model[key] if isinstance(model, Mapping) else getattr(model, key)


def embedding_size(model: ModelSettings) -> int:
    """E: the width of the token embeddings (hidden_size unless the family factorises it)."""
    value = model.get("embedding_size") if isinstance(model, Mapping) else None
    if not isinstance(model, Mapping):
        value = getattr(model, "embedding_size", None)
    return value or setting(model, "hidden_size")


def training_flops(module: torch.nn.Module, batch: dict) -> Any:
    """FLOPs of one micro-batch's forward and backward pass: 3 x the module's
    `forward_flops(batch)`, or by the 6N rule on the batch's real tokens when it has none."""
    forward = module.forward_flops(batch)
    if forward is None:
        forward = parameter_rule_flops(module, batch["attention_mask"].sum())
    return 3 * forward


def parameter_rule_flops(module: torch.nn.Module, tokens: Count) -> Any:
    """Forward FLOPs by the 2N rule (6N a trained token): 2 per trainable parameter and token
    (ZeRO-3's partitioned parameters counted whole), for families without a formula."""
    if not hasattr(module, "_trainable_parameters"):
        module._trainable_parameters = sum(
            getattr(p, "ds_numel", p.numel()) for p in module.parameters() if p.requires_grad
        )
    return 2 * module._trainable_parameters * tokens


def device_peak_tflops(precision: str, device: torch.device) -> tuple[float | None, str]:
    """One device's dense peak in TFLOP/s for `precision` (Lightning's: 32-true, bf16-mixed,
    ...) and where it came from: the table for a known GPU (fp32 runs count TF32 when
    `torch.backends.cuda.matmul.allow_tf32` is on), else None: a CPU has no datasheet peak that
    a run can read (a measured GEMM moves with the machine's load from run to run, so an MFU
    against it compares nothing), so CPU runs log train/mfu only with trainer.peak_tflops."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        kind = precision_kind(precision)
        if kind == "fp32" and torch.backends.cuda.matmul.allow_tf32:
            kind = "tf32"
        for fragment, peaks in DEVICE_PEAK_TFLOPS.items():
            if fragment in name and peaks.get(kind):
                return peaks[kind], f"{fragment} {kind} (table)"
        return (
            None,
            f"{name} is not in pretrain.models.flops.DEVICE_PEAK_TFLOPS: set trainer.peak_tflops",
        )
    if device.type == "cpu":
        return None, "a CPU has no datasheet peak: set trainer.peak_tflops for train/mfu"
    return None, f"no peak known for {device.type}: set trainer.peak_tflops"


def precision_kind(precision: str) -> str:
    """bf16, fp16 or fp32: the matmul precision of a Lightning precision setting."""
    if "bf16" in precision:
        return "bf16"
    if precision.startswith("16"):
        return "fp16"
    return "fp32"


def model_flops_metrics(flops_per_s: float, peak_tflops: float | None) -> dict:
    """This rank's model FLOP/s (`pretrain.models.flops`: the family's FLOP model, else the 6N rule)
    in TFLOP/s as `train/model_tflops`, and over the device's peak (TFLOP/s:
    `trainer.peak_tflops`, else the table or a measured CPU GEMM) as `train/mfu`."""
    metrics = {"train/model_tflops": flops_per_s / 1e12}
    if peak_tflops:
        metrics["train/mfu"] = metrics["train/model_tflops"] / peak_tflops
    return metrics
