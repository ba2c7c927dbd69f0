"""TinyBERT's loss terms against hand-computed values, the layer-wise trace against the
encoder's own forward, head gates against physically pruned heads, weight-pruning masks, and
the one-line refusals of students TinyBERT cannot map onto a teacher."""

import math

import pytest
import torch

from pretrain.compress import prune, tinybert
from pretrain.compress.encoders import EncoderWithMLM
from pretrain.compress.trace import trace_encoder
from pretrain.data.vocab import Vocabulary
from pretrain.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = Vocabulary(size=40, pad=0, unk=1, cls=2, sep=3, mask=4)


def model_config(hidden: int = 16, layers: int = 2, heads: int = 2, ffn: int = 32) -> dict:
    return {
        "name": "t",
        "_target_": "pretrain.models.bert.BertEncoder",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": ffn,
        "max_position_embeddings": 16,
        "type_vocab_size": 2,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "layer_norm_eps": 1e-12,
        "initializer_range": 0.2,
    }


def tiny(seed: int = 0, **sizes) -> EncoderWithMLM:
    torch.manual_seed(seed)
    return EncoderWithMLM(model_config(**sizes), VOCAB).eval()


def batch() -> dict:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, VOCAB.size, (3, 10), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 8:] = 0
    ids[mask == 0] = VOCAB.pad
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    return {
        "input_ids": ids,
        "token_type_ids": torch.zeros_like(ids),
        "attention_mask": mask,
        "labels": labels,
    }


def test_layer_map_is_tinyberts_uniform_map_and_refuses_a_deeper_student():
    assert tinybert.layer_map(4, 12) == [3, 6, 9, 12]
    assert tinybert.layer_map(1, 2) == [2]
    assert tinybert.layer_map(3, 4) == [1, 2, 4]
    with pytest.raises(ConfigError, match="student.num_hidden_layers = 3"):
        tinybert.layer_map(3, 2)


def test_masked_mse_averages_the_selected_rows_over_features():
    student = torch.tensor([[[1.0, 2.0], [0.0, 0.0], [5.0, 5.0]]])
    teacher = torch.tensor([[[0.0, 0.0], [3.0, 4.0], [5.0, 3.0]]])
    where = torch.tensor([[True, False, True]])
    # rows 0 and 2: ((1 + 4) / 2 + (0 + 4) / 2) / 2
    assert float(tinybert.masked_mse(student, teacher, where)) == pytest.approx(2.25)


def test_attention_loss_counts_only_pairs_of_real_tokens():
    student = torch.zeros(1, 1, 3, 3)
    teacher = torch.arange(9.0).view(1, 1, 3, 3)
    real = torch.tensor([[True, True, False]])
    # pairs (0,0) (0,1) (1,0) (1,1): teacher 0, 1, 3, 4 -> (0 + 1 + 9 + 16) / 4
    assert float(tinybert.attention_loss(student, teacher, real)) == pytest.approx(6.5)


def test_soft_cross_entropy_is_the_teachers_tempered_distribution_against_the_students():
    student = torch.tensor([[1.0, 0.0]])
    teacher = torch.tensor([[0.0, 2.0]])
    temperature = 2.0
    p1 = 1 / (1 + math.exp(-1))  # teacher at T = 2: softmax([0, 1])
    q0 = 1 / (1 + math.exp(-0.5))  # student at T = 2: softmax([0.5, 0])
    expected = -((1 - p1) * math.log(q0) + p1 * math.log(1 - q0))
    got = tinybert.soft_cross_entropy(student, teacher, temperature)
    assert float(got) == pytest.approx(expected, rel=1e-6)


def test_trace_ends_where_the_encoder_does_and_its_scores_are_scaled_dot_products():
    model, data = tiny(), batch()
    inputs = (data["input_ids"], data["token_type_ids"], data["attention_mask"])
    with torch.no_grad():
        trace = trace_encoder(model.encoder, *inputs)
        expected = model.encoder(*inputs)
        attention = model.encoder.layers[0].attention
        query, key, _ = attention.query_key_value(trace.embeddings)
    real = data["attention_mask"].bool()
    torch.testing.assert_close(trace.hidden[-1][real], expected[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(trace.scores[0], query @ key.transpose(-1, -2) / math.sqrt(8))
    assert len(trace.hidden) == len(trace.scores) == 2


def test_intermediate_losses_are_the_sums_over_the_layer_map():
    teacher, student = tiny(0, layers=4), tiny(1, hidden=8, layers=2)
    distiller = tinybert.LayerwiseDistiller(student, teacher)
    data = batch()
    inputs = (data["input_ids"], data["token_type_ids"], data["attention_mask"])
    real = data["attention_mask"].bool()
    with torch.no_grad():
        losses = distiller.losses(data, "intermediate")
        t, s = trace_encoder(teacher.encoder, *inputs), trace_encoder(student.encoder, *inputs)
        w = distiller.projections

        def mse(a, b):
            return ((a - b) ** 2).mean(-1)[real].mean()

        hidden = mse(w[1](s.hidden[0]), t.hidden[1]) + mse(w[2](s.hidden[1]), t.hidden[3])
        pairs = real[:, None, :, None] & real[:, None, None, :]

        def attention(a, b):
            return ((a - b) ** 2)[pairs.expand_as(a)].mean()

        attn = attention(s.scores[0], t.scores[1]) + attention(s.scores[1], t.scores[3])
        embedding = mse(w[0](s.embeddings), t.embeddings)
    assert distiller.layers == [2, 4]
    assert float(losses["hidden_loss"]) == pytest.approx(float(hidden), rel=1e-5)
    assert float(losses["attention_loss"]) == pytest.approx(float(attn), rel=1e-5)
    assert float(losses["embedding_loss"]) == pytest.approx(float(embedding), rel=1e-5)
    assert float(losses["loss"]) == pytest.approx(float(hidden + attn + embedding), rel=1e-5)


def test_prediction_loss_reads_the_labelled_positions_only():
    teacher, student = tiny(0), tiny(1, hidden=8, layers=1)
    distiller = tinybert.LayerwiseDistiller(student, teacher)
    data = batch()
    where = data["labels"] != -100
    with torch.no_grad():
        inputs = (data["input_ids"], data["token_type_ids"], data["attention_mask"])
        expected = tinybert.soft_cross_entropy(
            student(*inputs)[where], teacher(*inputs)[where], 2.0
        )
        got = distiller.losses(data, "prediction", temperature=2.0)["loss"]
    assert float(got) == pytest.approx(float(expected), rel=1e-5)


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ({"hidden": 32}, "student.hidden_size = 32: wider than the teacher's 16"),
        ({"heads": 4}, "student.num_attention_heads = 4"),
        ({"layers": 3}, "student.num_hidden_layers = 3"),
    ],
)
def test_students_tinybert_cannot_map_are_refused_in_one_line(sizes, message):
    with pytest.raises(ConfigError, match=message) as error:
        tinybert.LayerwiseDistiller(tiny(1, **sizes), tiny(0))
    assert "\n" not in str(error.value)


def test_a_zero_gate_is_the_same_model_as_the_pruned_head_and_the_dense_copy():
    model, data = tiny(layers=2, heads=4), batch()
    inputs = (data["input_ids"], data["token_type_ids"], data["attention_mask"])
    gates = torch.ones(2, 4)
    gates[0, 1] = gates[0, 3] = gates[1, 0] = 0
    with torch.no_grad():
        gated = trace_encoder(model.encoder, *inputs, head_gates=gates).hidden[-1]
    prune.prune_heads(model, {0: [1, 3], 1: [0]})
    assert model.encoder.layers[0].attention.qkv.weight.shape == (3 * 2 * 4, 16)
    assert model.encoder.layers[1].attention.output.weight.shape == (16, 3 * 4)
    dense = prune.dense_copy(model, VOCAB)
    with torch.no_grad():
        torch.testing.assert_close(model.encoder(*inputs), gated, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(dense(*inputs), model(*inputs), atol=1e-5, rtol=1e-5)
    assert int(dense.encoder.layers[0].attention.output.weight[:, 4:8].count_nonzero()) == 0


def test_heads_to_prune_takes_the_least_important_and_leaves_a_head_in_every_layer():
    importance = torch.tensor([[0.1, 0.2, 0.9], [0.05, 0.01, 0.03]])
    assert prune.heads_to_prune(importance, 0.5) == {0: [0], 1: [1, 2]}
    assert prune.heads_to_prune(importance, 0.0) == {}
    with pytest.raises(ConfigError, match="method.head_fraction = 1"):
        prune.heads_to_prune(importance, 1)


def test_head_importance_is_the_normalised_gradient_magnitude_of_the_gates():
    model, data = tiny(), batch()
    importance = prune.head_importance(model, [data], steps=1)
    gates = torch.ones(2, 2, requires_grad=True)
    (grad,) = torch.autograd.grad(prune.mlm_loss(model, data, gates), gates)
    expected = grad.abs() / grad.abs().norm(dim=1, keepdim=True)
    torch.testing.assert_close(importance, expected)
    torch.testing.assert_close(importance.norm(dim=1), torch.ones(2))


def test_magnitude_pruning_zeroes_the_smallest_weights_to_the_target_sparsity():
    model = tiny()
    weights = prune.prunable_weights(model)
    before = torch.cat([w.detach().abs().flatten() for w in weights.values()])
    reached = prune.magnitude_prune(model, 0.3)
    after = torch.cat([w.detach().flatten() for w in weights.values()])
    assert reached == pytest.approx(round(0.3 * before.numel()) / before.numel())
    threshold = before.sort().values[round(0.3 * before.numel()) - 1]
    assert bool((after[before > threshold] != 0).all())
    assert bool((after[before < threshold] == 0).all())
    assert float(model.encoder.embeddings.word_embeddings.weight.abs().min()) >= 0  # untouched
    assert int(model.encoder.embeddings.word_embeddings.weight.count_nonzero()) > 0.9 * 40 * 16


def test_tinybert_4_config_has_the_published_size():
    from omegaconf import OmegaConf

    from pretrain.paths import CONF_DIR

    config = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "compress/student/tinybert_4.yaml"))
    bert_vocab = Vocabulary(size=30522, pad=0, unk=100, cls=101, sep=102, mask=103)
    model = EncoderWithMLM(config, bert_vocab)  # encoder and MLM head (its decoder tied)
    pooler = 312 * 312 + 312
    count = sum(p.numel() for p in model.parameters()) + pooler
    assert count == pytest.approx(14.5e6, rel=0.005)  # Jiao et al., 2020: 14.5M


def test_bad_method_values_fail_when_composed_naming_the_key():
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from pretrain.compress.cli import compose_compress

    with pytest.raises((ConfigError, OmegaConfBaseException), match="method.kind"):
        OmegaConf.to_object(compose_compress(["method=prune_heads", "method.kind=random"]))
    run = OmegaConf.to_object(compose_compress(["method=int8", "out_dir=x"]))
    assert run.method.qat_steps == 0 and run.student["name"] == "tinybert_4"


def test_task_loss_is_the_layerwise_terms_plus_the_teachers_soft_class_targets():
    teacher, student = tiny(0, layers=2), tiny(1, hidden=8, layers=1)
    distiller = tinybert.LayerwiseDistiller(student, teacher)
    torch.manual_seed(2)
    teacher_head = torch.nn.Linear(16, 3)
    distiller.attach_task_heads(teacher_head)
    data, temperature = batch(), 2.0
    inputs = (data["input_ids"], data["token_type_ids"], data["attention_mask"])
    with torch.no_grad():
        losses = distiller.losses(data, "task", temperature)
        intermediate = distiller.losses(data, "intermediate")["loss"]
        z_t = teacher_head(teacher.encoder(*inputs)[:, 0]) / temperature  # (3 rows, 3 classes)
        z_s = distiller.task_head(student.encoder(*inputs)[:, 0]) / temperature
    targets = [[math.exp(v) / sum(math.exp(u) for u in row) for v in row] for row in z_t.tolist()]
    log_probs = [[v - math.log(sum(math.exp(u) for u in row)) for v in row] for row in z_s.tolist()]
    expected = -sum(
        sum(p * q for p, q in zip(t, s, strict=True))
        for t, s in zip(targets, log_probs, strict=True)
    ) / len(targets)
    assert distiller.task_head.weight.shape == (3, 8) and distiller.task_head.weight.requires_grad
    assert not teacher_head.weight.requires_grad
    assert float(losses["task_loss"]) == pytest.approx(expected, rel=1e-5)
    assert float(losses["loss"]) == pytest.approx(float(intermediate) + expected, rel=1e-5)
    with pytest.raises(ConfigError, match="attach_task_heads"):
        tinybert.LayerwiseDistiller(tiny(1, hidden=8, layers=1), teacher).losses(data, "task")
