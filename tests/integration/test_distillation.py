"""DistilBERT: the student starts from one teacher layer in two, the teacher stays frozen and
out of the student's checkpoint, distillation brings the student towards a teacher trained
here, and the student exports to `DistilBertForMaskedLM` with our logits."""

import math

import pytest
import torch
from test_import import EncoderWithHead, assert_logits_match, family_config, make_family_checkpoint
from test_objectives_train import logged
from test_train import tiny_overrides

from pretrain.checkpoint.compat import objective_state_dict
from pretrain.cli.params import parameter_counts
from pretrain.config import ConfigError, compose_config, validate
from pretrain.data.vocab import load_vocabulary
from pretrain.export import export_checkpoint
from pretrain.objectives.distillation import (
    DistillationModule,
    cosine_loss,
    distillation_kl,
)
from pretrain.runtime.run import train

transformers = pytest.importorskip("transformers")

OBJECTIVE = {
    "name": "distillation",
    "_target_": "pretrain.objectives.distillation.DistillationModule",
    "pair_task": "none",
    "temperature": 2.0,
    "alpha_ce": 5.0,
    "alpha_mlm": 2.0,
    "alpha_cos": 1.0,
}


def teacher_config(layers: int) -> dict:
    """A BERT teacher (with token types) without dropout."""
    config = family_config("bert") | {"num_hidden_layers": layers}
    return config | {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def student_config(layers: int) -> dict:
    model = family_config("distilbert") | {"num_hidden_layers": layers}
    return model | {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


DATA = {"format": "full_sentences", "max_seq_length": 32}  # within the models' 40 positions


def student(teacher_path, layers: int, vocab) -> DistillationModule:
    config = {
        "seed": 0,
        "model": student_config(layers),
        "objective": OBJECTIVE | {"teacher": str(teacher_path)},
        "data": DATA,
    }
    return DistillationModule(config, vocab)


@pytest.fixture(scope="module")
def teacher_ckpt(prepared_corpus, tmp_path_factory):
    path = tmp_path_factory.mktemp("teacher") / "teacher.ckpt"
    make_family_checkpoint(path, teacher_config(4), prepared_corpus / "tokenizer", seed=3)
    return path


def masked_batch(vocab, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab.size, (3, 16), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 10:] = 0
    input_ids[attention_mask == 0] = vocab.pad
    labels = torch.full_like(input_ids, -100)
    labels[:, 2:5] = input_ids[:, 2:5]
    input_ids[:, 2:4] = vocab.mask
    return {
        "input_ids": input_ids,
        "token_type_ids": torch.zeros_like(input_ids),
        "attention_mask": attention_mask,
        "labels": labels,
    }


def test_kl_is_the_softened_kl_divergence_times_t_squared():
    generator = torch.Generator().manual_seed(0)
    student_logits, teacher_logits = torch.randn(2, 3, 7, generator=generator)
    t = 2.0
    p = torch.softmax(teacher_logits / t, -1)
    q = torch.softmax(student_logits / t, -1)
    by_hand = (
        sum(sum(p[i, k] * math.log(p[i, k] / q[i, k]) for k in range(7)) for i in range(3))
        / 3
        * t**2
    )
    assert float(distillation_kl(student_logits, teacher_logits, t)) == pytest.approx(
        float(by_hand), rel=1e-5
    )
    assert float(distillation_kl(teacher_logits, teacher_logits, t)) == pytest.approx(0, abs=1e-6)


def test_cosine_loss_is_one_minus_the_cosine():
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]])
    b = torch.tensor([[2.0, 0.0], [0.0, -1.0], [0.0, 5.0]])  # cosines 1, -1, 0
    assert float(cosine_loss(a, b)) == pytest.approx((0 + 2 + 1) / 3)


def test_student_starts_from_every_other_teacher_layer(teacher_ckpt, prepared_corpus):
    vocab = load_vocabulary(prepared_corpus / "tokenizer")
    module = student(teacher_ckpt, 2, vocab)
    teacher = module.teacher
    for index, source in ((0, 0), (1, 2)):
        ours, theirs = (
            module.encoder.layers[index].state_dict(),
            teacher.encoder.layers[source].state_dict(),
        )
        for name in theirs:
            assert torch.equal(ours[name], theirs[name]), (index, name)
    assert not torch.equal(
        module.encoder.layers[1].attention.qkv.weight,
        teacher.encoder.layers[1].attention.qkv.weight,
    )
    # no token types: the teacher's type-0 row is folded into the positions, embeddings agree
    ids = masked_batch(vocab)["input_ids"]
    module.eval()
    with torch.no_grad():
        torch.testing.assert_close(module.encoder.embeddings(ids), teacher.encoder.embeddings(ids))
    torch.testing.assert_close(module.mlm_head.bias, teacher.mlm_head.bias)


def test_teacher_is_frozen_and_not_part_of_the_student(teacher_ckpt, prepared_corpus):
    vocab = load_vocabulary(prepared_corpus / "tokenizer")
    module = student(teacher_ckpt, 2, vocab)
    module.train()
    assert not module.teacher.training and not any(
        p.requires_grad for p in module.teacher.parameters()
    )
    teacher_ids = {id(p) for p in module.teacher.parameters()}
    assert not teacher_ids & {id(p) for p in module.parameters()}
    assert all(key.startswith(("encoder.", "mlm_head.")) for key in module.state_dict())
    assert parameter_counts(student_config(2), vocab.size)["total"] == sum(
        p.numel() for p in module.encoder.parameters()
    )


def test_a_full_depth_student_matches_its_teacher(teacher_ckpt, prepared_corpus):
    """With as many layers as the teacher, the initialised student is the teacher: the KL and
    cosine losses are 0, and the student's MLM loss is the teacher's."""
    vocab = load_vocabulary(prepared_corpus / "tokenizer")
    module = student(teacher_ckpt, 4, vocab).eval()
    with torch.no_grad():
        out = module(masked_batch(vocab))
    assert float(out["kl_loss"]) < 1e-5 and float(out["cos_loss"]) < 1e-5, out
    shallow = student(teacher_ckpt, 2, vocab).eval()
    with torch.no_grad():
        out = shallow(masked_batch(vocab))
    assert float(out["kl_loss"]) > 1e-3 and float(out["cos_loss"]) > 1e-3, out


def test_teacher_from_a_hugging_face_directory(teacher_ckpt, prepared_corpus, tmp_path):
    vocab = load_vocabulary(prepared_corpus / "tokenizer")
    hf_dir = export_checkpoint(teacher_ckpt, tmp_path / "hf")
    from_hf, from_ckpt = student(hf_dir, 2, vocab), student(teacher_ckpt, 2, vocab)
    a, b = from_hf.state_dict(), from_ckpt.state_dict()
    assert sorted(a) == sorted(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_bad_settings_name_their_key(prepared_corpus, tmp_path):
    vocab = load_vocabulary(prepared_corpus / "tokenizer")
    with pytest.raises(ConfigError, match="^objective.teacher is not set"):
        DistillationModule(
            {"seed": 0, "model": student_config(2), "objective": dict(OBJECTIVE), "data": DATA},
            vocab,
        )
    with pytest.raises(ConfigError, match="^objective.teacher=.*no such file"):
        student(tmp_path / "missing.ckpt", 2, vocab)
    with pytest.raises(ConfigError, match="^objective.pair_task"):
        validate(compose_config(["experiment=distilbert", "objective.pair_task=nsp"]))
    with pytest.raises(ConfigError, match="^objective.temperature"):
        validate(compose_config(["experiment=distilbert", "objective.temperature=0"]))


def test_recipe_and_paper_parameter_count():
    config = validate(compose_config(["experiment=distilbert"]))
    objective = config.objective
    assert (
        objective.temperature,
        objective.alpha_ce,
        objective.alpha_mlm,
        objective.alpha_cos,
    ) == (
        2.0,
        5.0,
        2.0,
        1.0,
    )
    assert config.model.num_hidden_layers == 6 and config.model.hidden_size == 768
    assert config.data.format == "full_sentences" and objective.pair_task == "none"
    counts = parameter_counts(
        {k: v for k, v in vars(config.model).items()}, config.model.reference_vocab_size
    )
    assert abs(counts["total"] - 66e6) / 66e6 < 0.01, counts  # DistilBERT: 66M (Sanh et al.)


@pytest.mark.slow
def test_distillation_brings_the_student_towards_a_teacher_trained_here(prepared_corpus, tmp_path):
    common = ("data=full_sentences", "objective=mlm", "trainer.log_every_n_steps=1")
    teacher_dir = tmp_path / "teacher"
    train(
        compose_config(
            tiny_overrides(
                prepared_corpus,
                teacher_dir,
                *common,
                "trainer.max_steps=40",
                "optim.optimizer.lr=2e-3",
            )
        )
    )
    teacher = teacher_dir / "checkpoints" / "last.ckpt"
    run_dir = tmp_path / "student"
    overrides = tiny_overrides(
        prepared_corpus,
        run_dir,
        "experiment=distilbert",
        "model=distilbert",
        "model.hidden_size=128",
        "model.num_attention_heads=2",
        "model.intermediate_size=512",
        "model.num_hidden_layers=1",
        "data.max_seq_length=64",
        "data.global_batch_size=null",
        "trainer.max_steps=30",
        "trainer.log_every_n_steps=1",
        f"objective.teacher={teacher}",
        "objective.init_from_teacher=false",  # start far from the teacher, to see it approach
    )
    train(compose_config(overrides))
    kl = logged(run_dir, "train/kl_loss")
    assert len(kl) == 30 and sum(kl[-5:]) / 5 < 0.3 * sum(kl[:5]) / 5, kl
    cos = logged(run_dir, "train/cos_loss")
    assert sum(cos[-5:]) / 5 < sum(cos[:5]) / 5, cos
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    weights = objective_state_dict(checkpoint["state_dict"])  # the teacher is not saved
    assert all(key.startswith(("encoder.", "mlm_head.")) for key in weights)

    out = export_checkpoint(run_dir / "checkpoints" / "last.ckpt", tmp_path / "hf")
    vocab = load_vocabulary(prepared_corpus / "tokenizer")
    module = EncoderWithHead(checkpoint["config"]["model"], vocab.size, vocab.pad)
    module.load_state_dict(weights, strict=True)
    hf, info = transformers.DistilBertForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert_logits_match(module.eval(), hf.eval(), vocab.size, vocab.pad)
    assert transformers.AutoTokenizer.from_pretrained(out).mask_token == "[MASK]"
