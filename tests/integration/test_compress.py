"""pretrain-compress on tiny models: the head-pruned export loads in transformers with the
pruned model's logits, int8 stays within a stated tolerance of fp32 (and reloads, and runs as
a torch.export program without this project), TinyBERT and pruning write loadable
directories with their reports, and bad inputs fail in one line."""

import json
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from pretrain.compress.cli import compose_compress
from pretrain.compress.encoders import EncoderWithMLM, load_model, write_hf_directory
from pretrain.data.vocab import load_vocabulary
from pretrain.errors import ConfigError

transformers = pytest.importorskip("transformers")
pytest.importorskip("torchao")
pytestmark = pytest.mark.usefixtures("one_thread")

# int8 (per-channel weights, per-token activations) of this 2-layer, 64-wide encoder: the
# last hidden state (LayerNorm output, entries of order 1) within 0.05 of fp32 everywhere
INT8_TOLERANCE = 0.05


def teacher_config(hidden: int = 64, heads: int = 4) -> dict:
    return {
        "name": "teacher",
        "_target_": "pretrain.models.bert.BertEncoder",
        "hidden_size": hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "intermediate_size": 2 * hidden,
        "max_position_embeddings": 64,
        "type_vocab_size": 2,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "layer_norm_eps": 1e-12,
        "initializer_range": 0.05,
    }


def write_teacher(tokenizer_dir, out_dir, seed: int = 0, **sizes):
    vocab = load_vocabulary(tokenizer_dir)
    torch.manual_seed(seed)
    return write_hf_directory(
        EncoderWithMLM(teacher_config(**sizes), vocab), tokenizer_dir, vocab, out_dir
    )


@pytest.fixture(scope="module")
def teacher_dir(prepared_corpus, tmp_path_factory):
    return write_teacher(prepared_corpus / "tokenizer", tmp_path_factory.mktemp("t") / "hf")


def compress(prepared_corpus, teacher, out_dir, *overrides):
    """Run a method in process as `pretrain-compress` would; returns its report."""
    from hydra.utils import get_method

    cfg = compose_compress(
        [
            f"teacher={teacher}",
            f"out_dir={out_dir}",
            f"data.shards_dir={prepared_corpus}",
            "data.max_seq_length=64",
            "data.batch_size=4",
            "data.eval_batches=2",
            *overrides,
        ]
    )
    run = OmegaConf.to_object(cfg)
    return get_method(run.method._target_)(run)


def sample(vocab_size: int):
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(5, vocab_size, (3, 20), generator=generator)
    mask = torch.ones_like(ids)
    mask[2, 12:] = 0
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask}


def test_head_pruned_export_loads_in_transformers_with_the_pruned_models_logits(
    prepared_corpus, teacher_dir, tmp_path
):
    from pretrain.compress.prune import load_head_pruned

    out = tmp_path / "pruned"
    report = compress(
        prepared_corpus, teacher_dir, out, "method=prune_heads", "method.importance_steps=2"
    )
    assert sum(len(v) for v in report["pruned_heads"].values()) == 4  # half of 2 x 4 heads
    small = load_head_pruned(out)
    assert [layer.attention.num_heads for layer in small.encoder.layers] == [
        4 - len(report["pruned_heads"].get(str(i), [])) for i in range(2)
    ]
    hf = transformers.AutoModelForMaskedLM.from_pretrained(out, local_files_only=True).eval()
    inputs = sample(hf.config.vocab_size)
    with torch.no_grad():
        ours = small(*inputs.values())
        theirs = hf(**inputs).logits
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)
    assert json.loads((out / "config.json").read_text())["pruned_heads"] == report["pruned_heads"]
    assert report["parameters_after"] < sum(p.numel() for p in hf.parameters())


def test_int8_is_within_tolerance_reloads_and_runs_as_a_program_without_this_project(
    prepared_corpus, teacher_dir, tmp_path
):
    from pretrain.compress.quantize import load_hf_masked_lm, load_quantized

    out = tmp_path / "int8"
    report = compress(prepared_corpus, teacher_dir, out, "method=int8")
    fp32 = load_hf_masked_lm(teacher_dir)
    int8 = load_quantized(out)
    inputs = sample(fp32.config.vocab_size)
    with torch.no_grad():
        reference = fp32.base_model(**inputs).last_hidden_state
        quantized = int8.base_model(**inputs).last_hidden_state
    difference = float((reference - quantized).abs().max())
    assert 0 < difference < INT8_TOLERANCE
    assert report["max_abs_hidden_difference"] < INT8_TOLERANCE
    assert type(int8.base_model.encoder.layer[0].intermediate.dense.weight).__name__ == "Int8Tensor"
    torch.save({k: v for k, v in inputs.items()}, tmp_path / "inputs.pt")
    torch.save(quantized, tmp_path / "expected.pt")
    script = (
        "import sys, torch, torchao\n"
        f"program = torch.export.load({str(out / 'encoder.pt2')!r}).module()\n"
        f"x = torch.load({str(tmp_path / 'inputs.pt')!r})\n"
        "y = program(x['input_ids'], x['token_type_ids'], x['attention_mask'])\n"
        f"torch.testing.assert_close(y, torch.load({str(tmp_path / 'expected.pt')!r}))\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'pretrain'], 'imported pretrain'\n"
    )
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}  # no PYTHONPATH: not this project
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_quantization_aware_finetuning_trains_then_converts_to_int8(
    prepared_corpus, teacher_dir, tmp_path
):
    from pretrain.compress.quantize import load_quantized

    report = compress(
        prepared_corpus, teacher_dir, tmp_path / "qat", "method=int8_qat", "method.qat_steps=3"
    )
    assert report["qat_first_loss"] > 0 and report["max_abs_hidden_difference"] > 0
    model = load_quantized(tmp_path / "qat")
    assert type(model.base_model.encoder.layer[1].output.dense.weight).__name__ == "Int8Tensor"


def test_tinybert_writes_a_student_that_loads_with_its_report(
    prepared_corpus, teacher_dir, tmp_path
):
    out = tmp_path / "student"
    report = compress(
        prepared_corpus,
        teacher_dir,
        out,
        "method=tinybert",
        "student=tinybert_demo",
        "student.hidden_size=32",
        "student.num_attention_heads=4",
        "method.intermediate_steps=6",
        "method.prediction_steps=4",
        "method.task=builtin_order",
        "method.task_steps=2",
        "method.teacher_task_steps=2",
    )
    assert [stage["stage"] for stage in report["stages"]] == ["intermediate", "prediction", "task"]
    assert report["layer_map"] == [2]
    assert report["stages"][0]["last_loss"] < report["stages"][0]["first_loss"]
    assert 0 <= report["task_accuracy"] <= 1 and 0 <= report["teacher_task_accuracy"] <= 1
    hf = transformers.AutoModelForMaskedLM.from_pretrained(out, local_files_only=True)
    assert hf.config.num_hidden_layers == 1 and hf.config.hidden_size == 32
    assert json.loads((out / "compression.json").read_text()) == report


def test_a_mobilebert_student_distils_and_loads_as_transformers_mobilebert(
    prepared_corpus, teacher_dir, tmp_path
):
    from pretrain.compress.mobilebert import MobileBertWithMLM

    out = tmp_path / "mobile"
    report = compress(
        prepared_corpus,
        teacher_dir,
        out,
        "method=tinybert",
        "student=mobilebert_demo",
        "student.hidden_size=64",
        "student.num_attention_heads=4",
        "student.num_hidden_layers=1",
        "method.intermediate_steps=8",
        "method.prediction_steps=2",
    )
    assert report["student"] == "mobilebert_demo"
    assert report["stages"][0]["last_loss"] < report["stages"][0]["first_loss"]
    hf = transformers.AutoModelForMaskedLM.from_pretrained(out, local_files_only=True).eval()
    assert type(hf).__name__ == "MobileBertForMaskedLM"
    data = sample(hf.config.vocab_size)
    config = json.loads((out / "config.json").read_text())
    ours = MobileBertWithMLM({**config, "name": "m"}, load_vocabulary(out)).eval()
    ours.load_state_dict(hf.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(ours(**data), hf(**data).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["magnitude", "movement"])
def test_weight_pruning_reaches_its_sparsity_and_reports_accuracy(
    prepared_corpus, teacher_dir, tmp_path, kind
):
    out = tmp_path / kind
    report = compress(
        prepared_corpus,
        teacher_dir,
        out,
        f"method=prune_{kind}",
        "method.sparsity=0.6",
        "method.steps=3",
    )
    assert report["sparsity"] == pytest.approx(0.6, abs=1e-3)
    assert 0 <= report["mlm_accuracy"] <= 1
    pruned = load_model(out).model
    weights = [m.weight for m in pruned.encoder.layers.modules() if isinstance(m, torch.nn.Linear)]
    zeros = sum(int((w == 0).sum()) for w in weights) / sum(w.numel() for w in weights)
    assert zeros == pytest.approx(0.6, abs=1e-3)


def test_a_teacher_of_another_tokenizer_is_refused_in_one_line(
    prepared_corpus, prepared_chinese_corpus, tmp_path
):
    teacher = write_teacher(prepared_chinese_corpus / "tokenizer", tmp_path / "zh")
    with pytest.raises(ConfigError, match=r"teacher=.*its tokenizer .* is not the one of") as error:
        compress(prepared_corpus, teacher, tmp_path / "out", "method=prune_heads")
    assert "\n" not in str(error.value)


def test_the_console_script_says_what_is_wrong_in_one_line(prepared_corpus, teacher_dir, tmp_path):
    command = [
        sys.executable,
        "-m",
        "pretrain.compress.cli",
        f"teacher={teacher_dir}",
        f"data.shards_dir={prepared_corpus}",
        f"out_dir={tmp_path / 'wide'}",
        "method=tinybert",
        "student=tinybert_demo",
        "student.hidden_size=128",
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("pretrain-compress:")]
    assert len(lines) == 1 and "student.hidden_size = 128: wider than the teacher's 64" in lines[0]
    missing = subprocess.run(
        command[:3] + ["teacher=/nonexistent/model"], capture_output=True, text=True
    )
    assert missing.returncode == 2
    assert "teacher=/nonexistent/model: no such file or directory" in missing.stderr


def test_cfg_job_composes_without_importing_torch():
    script = (
        "import sys\n"
        "sys.argv = ['pretrain-compress', '--cfg', 'job', 'method=prune_movement', 'out_dir=x']\n"
        "from pretrain.compress.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'transformers', 'torchao') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "kind: movement" in done.stdout and done.stdout.splitlines()[-1] == "[]"
