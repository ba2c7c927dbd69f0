"""The MobileBERT student: its shapes, its published sizes, its export to transformers'
MobileBertForMaskedLM with the same logits, its layer-wise losses against a BERT teacher, and
the one-line refusals."""

import pytest
import torch
from omegaconf import OmegaConf

from pretrain.compress import tinybert
from pretrain.compress.encoders import EncoderWithMLM, build_student
from pretrain.compress.mobilebert import MobileBertWithMLM
from pretrain.data.vocab import Vocabulary
from pretrain.errors import ConfigError
from pretrain.export.hf import write_hf_model
from pretrain.paths import CONF_DIR

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = Vocabulary(size=40, pad=0, unk=1, cls=2, sep=3, mask=4)
BERT_VOCAB = Vocabulary(size=30522, pad=0, unk=100, cls=101, sep=102, mask=103)


def student_config(**changes) -> dict:
    config = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "compress/student/mobilebert.yaml"))
    config.update(
        hidden_size=16,
        embedding_size=8,
        intra_bottleneck_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=12,
        num_feedforward_networks=3,
        max_position_embeddings=16,
        attention_probs_dropout_prob=0.0,
    )
    config.update(changes)
    return config


def teacher(layers: int = 4, hidden: int = 16, heads: int = 2) -> EncoderWithMLM:
    torch.manual_seed(0)
    config = {
        "name": "t",
        "_target_": "pretrain.models.bert.BertEncoder",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": 32,
        "max_position_embeddings": 16,
        "type_vocab_size": 2,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "layer_norm_eps": 1e-12,
        "initializer_range": 0.2,
    }
    return EncoderWithMLM(config, VOCAB).eval()


def random_student(**changes) -> MobileBertWithMLM:
    """A student whose every parameter (the NoNorm scales too) is random."""
    torch.manual_seed(1)
    model = build_student(student_config(**changes), VOCAB).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    return model


def batch() -> dict:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, VOCAB.size, (3, 10), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    ids[mask == 0] = VOCAB.pad
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}


def count(name: str, **changes) -> int:
    config = OmegaConf.to_container(OmegaConf.load(CONF_DIR / f"compress/student/{name}.yaml"))
    with torch.device("meta"):
        model = MobileBertWithMLM({**config, **changes}, BERT_VOCAB)
    return sum(p.numel() for p in model.mobilebert.parameters())  # embeddings + layers


def test_published_sizes():
    from transformers import MobileBertConfig, MobileBertModel

    # the paper's Table 1 rows (Sun et al., 2020), counted as BERT's papers count: no MLM head
    assert count("mobilebert") == pytest.approx(25.3e6, rel=0.01)
    # MobileBERT-tiny's row builds 15.49M against the paper's 15.1M (2.6% more; which part
    # the paper counts differently is not stated), so this checks the configuration to 3%
    assert count("mobilebert_tiny") == pytest.approx(15.1e6, rel=0.03)
    # transformers' MobileBERT (queries and keys from a shared bottleneck: the released
    # checkpoint, 24.58M) and tiny: the same count as transformers builds
    for name, changes in (
        ("mobilebert", {"key_query_shared_bottleneck": True}),
        ("mobilebert_tiny", {}),
    ):
        config = {**OmegaConf.load(CONF_DIR / f"compress/student/{name}.yaml"), **changes}
        hf = {
            k: v for k, v in config.items() if k not in ("name", "_target_", "reference_vocab_size")
        }
        with torch.device("meta"):
            reference = MobileBertModel(MobileBertConfig(**hf), add_pooling_layer=False)
        assert count(name, **changes) == sum(p.numel() for p in reference.parameters())


def test_trace_shapes_are_the_body_width_and_the_heads():
    model, data = random_student(), batch()
    with torch.no_grad():
        trace = model.trace(**data)
        logits = model(**data)
    assert trace.embeddings.shape == (3, 10, 16)
    assert [h.shape for h in trace.hidden] == [(3, 10, 16)] * 2
    assert [s.shape for s in trace.scores] == [(3, 2, 10, 10)] * 2
    assert logits.shape == (3, 10, VOCAB.size)
    assert len(model.mobilebert.encoder.layer[0].ffn) == 2  # 3 FFNs: 2 stacked + the last


@pytest.mark.parametrize(
    "changes",
    [
        {"key_query_shared_bottleneck": True},  # the released checkpoint's
        {"use_bottleneck_attention": True, "num_feedforward_networks": 2},  # tiny's
        {
            "normalization_type": "layer_norm",
            "hidden_act": "gelu",
            "embedding_size": 16,
            "key_query_shared_bottleneck": True,
        },
    ],
)
def test_export_loads_as_transformers_mobilebert_with_the_same_logits(changes, tmp_path):
    from transformers import AutoModelForMaskedLM

    model, data = random_student(**changes), batch()
    write_hf_model(model.to_hf(), tmp_path, None)
    hf = AutoModelForMaskedLM.from_pretrained(str(tmp_path), local_files_only=True).eval()
    assert type(hf).__name__ == "MobileBertForMaskedLM"
    real = data["attention_mask"].bool()
    with torch.no_grad():
        expected = hf(**data).logits
        got = model(**data)
    torch.testing.assert_close(got[real], expected[real], atol=1e-4, rtol=1e-4)


def test_layerwise_losses_of_a_mobilebert_student_are_tinyberts_terms():
    big, student, data = teacher(layers=4), random_student(hidden_size=8), batch()
    distiller = tinybert.LayerwiseDistiller(student, big)
    real = data["attention_mask"].bool()
    with torch.no_grad():
        losses = distiller.losses(data, "intermediate")
        t, s, w = big.trace(**data), student.trace(**data), distiller.projections
        assert w[0].weight.shape == (16, 8)  # the student's 8-wide body up to the teacher's 16

        def mse(a, b):
            return ((a - b) ** 2).mean(-1)[real].mean()

        pairs = (real[:, None, :, None] & real[:, None, None, :]).expand(3, 2, 10, 10)
        hidden = mse(w[1](s.hidden[0]), t.hidden[1]) + mse(w[2](s.hidden[1]), t.hidden[3])
        attention = sum(
            ((s.scores[m] - t.scores[g]) ** 2)[pairs].mean() for m, g in ((0, 1), (1, 3))
        )
        embedding = mse(w[0](s.embeddings), t.embeddings)
        where = torch.zeros_like(real)
        where[:, 2] = True
        labels = torch.where(where, data["input_ids"], -100)
        prediction = distiller.losses({**data, "labels": labels}, "prediction", 2.0)["loss"]
        expected = tinybert.soft_cross_entropy(student(**data)[where], big(**data)[where], 2.0)
    assert float(losses["hidden_loss"]) == pytest.approx(float(hidden), rel=1e-5)
    assert float(losses["attention_loss"]) == pytest.approx(float(attention), rel=1e-5)
    assert float(losses["embedding_loss"]) == pytest.approx(float(embedding), rel=1e-5)
    assert float(prediction) == pytest.approx(float(expected), rel=1e-5)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"hidden_size": 32}, "student.hidden_size = 32: wider than the teacher's 16"),
        ({"num_attention_heads": 4}, "student.num_attention_heads = 4"),
        ({"normalization_type": "batch"}, "student.normalization_type = 'batch': one of"),
        ({"embedding_size": 32}, "student.embedding_size = 32: in 1..hidden_size"),
    ],
)
def test_students_that_cannot_be_built_or_mapped_are_refused_in_one_line(changes, message):
    with pytest.raises(ConfigError, match=message) as error:
        tinybert.LayerwiseDistiller(build_student(student_config(**changes), VOCAB), teacher())
    assert "\n" not in str(error.value)


def test_queries_and_keys_from_the_body_are_not_exported_and_say_why():
    with pytest.raises(ConfigError, match="no transformers MobileBertForMaskedLM form") as error:
        random_student().to_hf()
    assert "\n" not in str(error.value)
