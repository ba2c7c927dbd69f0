"""pretrain-compress on tiny models: every file it ships loads in a process that cannot import
this project (`load_fresh`) and gives the logits of the model it came from: the head-pruned
torch.export program (and its dense transformers copy), int8's TorchScript within a stated
tolerance of fp32, the TinyBERT, MobileBERT and weight-pruned transformers directories; the
reports hold what was done; bad inputs fail in one line."""

import json
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from pretrain.compress.artifacts import load_fresh
from pretrain.compress.cli import compose_compress
from pretrain.compress.encoders import EncoderWithMLM, load_model, write_hf_directory
from pretrain.data.vocab import load_vocabulary
from pretrain.errors import ConfigError

transformers = pytest.importorskip("transformers")
pytest.importorskip("torchao")
pytestmark = pytest.mark.usefixtures("one_thread")

# int8 (per-channel weights, per-batch activations) of this 2-layer, 64-wide encoder's
# Linear layers: every MLM logit within INT8_TOLERANCE of fp32's
INT8_TOLERANCE = 0.1


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


def test_head_pruned_model_ships_as_a_smaller_program_that_loads_without_this_project(
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
    inputs = sample(small.mlm_head.decoder.weight.shape[0])
    with torch.no_grad():
        ours = small(*inputs.values())
    # the shipped program: the smaller model, its logits, in a process without pretrain
    program = torch.export.load(out / "model.pt2").module()
    unique = {p.data_ptr(): p.numel() for p in program.parameters()}  # tied: one storage
    assert sum(unique.values()) == report["parameters_after"]
    torch.testing.assert_close(load_fresh(out / "model.pt2", inputs), ours, atol=1e-5, rtol=1e-5)
    # the dense copy for fine-tuning in transformers: the same logits, the teacher's size
    hf = transformers.AutoModelForMaskedLM.from_pretrained(out, local_files_only=True).eval()
    torch.testing.assert_close(hf(**inputs).logits, ours, atol=1e-5, rtol=1e-5)
    assert json.loads((out / "config.json").read_text())["pruned_heads"] == report["pruned_heads"]
    assert report["parameters_after"] < sum(p.numel() for p in hf.parameters())


def test_int8_ships_as_torchscript_within_tolerance_of_fp32_without_this_project(
    prepared_corpus, teacher_dir, tmp_path, monkeypatch
):
    from pretrain.compress.quantize import load_hf_masked_lm, load_quantized

    out = tmp_path / "int8"
    report = compress(prepared_corpus, teacher_dir, out, "method=int8")
    fp32 = load_hf_masked_lm(teacher_dir)
    int8 = load_quantized(out)
    inputs = sample(fp32.config.vocab_size)  # another shape than the trace's, with padding
    with torch.no_grad():
        reference = fp32(**inputs).logits
        quantized = int8(*inputs.values())
    assert 0 < float((reference - quantized).abs().max()) < INT8_TOLERANCE
    assert 0 < report["max_abs_logit_difference"] < INT8_TOLERANCE
    assert report["mlm_accuracy"] == pytest.approx(report["teacher_mlm_accuracy"], abs=0.05)
    assert "quantized::linear_dynamic" in str(int8.inlined_graph)  # torch's int8 kernels
    torch.testing.assert_close(load_fresh(out / "model.ts", inputs), quantized)
    monkeypatch.chdir(tmp_path)  # as `make demo-compress` names its artifacts: relative paths
    torch.testing.assert_close(load_fresh("int8/model.ts", inputs), quantized)
    ids, types = inputs["input_ids"], inputs["token_type_ids"]
    unpadded = int8(ids, types, torch.ones_like(ids))
    assert not torch.allclose(unpadded[2], quantized[2])  # the trace kept the padding mask
    hidden = int8.hidden_states(*inputs.values())
    assert hidden.shape == (3, 20, fp32.config.hidden_size)
    check = [sys.executable, "-m", "pretrain.export.check", str(out)]
    done = subprocess.run(check, capture_output=True, text=True)
    assert done.returncode == 0 and "torch.jit.load(model.ts)" in done.stdout, done.stderr[-2000:]


def test_quantization_aware_finetuning_trains_then_ships_int8(
    prepared_corpus, teacher_dir, tmp_path
):
    from pretrain.compress.quantize import load_hf_masked_lm

    out = tmp_path / "qat"
    report = compress(prepared_corpus, teacher_dir, out, "method=int8_qat", "method.qat_steps=3")
    assert report["qat_first_loss"] > 0 and report["max_abs_logit_difference"] > 0
    inputs = sample(report_vocab(out))
    with torch.no_grad():
        teacher = load_hf_masked_lm(teacher_dir)(**inputs).logits
    shipped = load_fresh(out / "model.ts", inputs)
    assert shipped.shape == teacher.shape and not torch.equal(shipped, teacher)


def report_vocab(directory) -> int:
    return json.loads((directory / "config.json").read_text())["vocab_size"]


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
    hf = transformers.AutoModelForMaskedLM.from_pretrained(out, local_files_only=True).eval()
    assert hf.config.num_hidden_layers == 1 and hf.config.hidden_size == 32
    assert json.loads((out / "compression.json").read_text()) == report
    inputs = sample(hf.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(
            load_fresh(out / "model.safetensors", inputs), hf(**inputs).logits
        )


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
        shipped = load_fresh(out / "model.safetensors", data)
    torch.testing.assert_close(shipped, ours(**data), atol=1e-4, rtol=1e-4)


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
    inputs = sample(report_vocab(out))
    with torch.no_grad():
        ours = pruned(*inputs.values())
    shipped = load_fresh(out / "model.safetensors", inputs)
    torch.testing.assert_close(shipped, ours, atol=1e-5, rtol=1e-5)


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
