"""A mixture's held-out loss per source (issue 55 item 4): with `data.holdout_shards`, each
source's last shards are held out; validation logs `val/source/<name>/loss`, the source's
loss weighed by predicted tokens, equal to a direct computation with the checkpoint of the
step; `pretrain-compare` shows them and the per-source counts."""

import csv
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import cpu_run_overrides

from pretrain.checkpoint.compat import objective_state_dict
from pretrain.config import compose_config
from pretrain.data.masking import IGNORE_INDEX
from pretrain.data.mixing import mix_schedule
from pretrain.data.mixture import source_spec
from pretrain.eval.compare import write_report
from pretrain.runtime.run import build_stream, train
from pretrain.runtime.validation import heldout_batches, heldout_spec

pytestmark = pytest.mark.usefixtures("one_thread")


def val_rows(run_dir: Path) -> dict[int, dict[str, float]]:
    """{step: {val/*: value}} from the run's CSV log."""
    with open(next(run_dir.glob("csv/version_*/metrics.csv"))) as f:
        return {
            int(row["step"]): {k: float(v) for k, v in row.items() if k.startswith("val/") and v}
            for row in csv.DictReader(f)
            if row.get("val/loss")
        }


@torch.no_grad()
def weighed_mlm_loss(module, batches: list[dict]) -> float:
    """The MLM loss over `batches` (F.cross_entropy on the masked positions), each batch's
    mean weighed by its masked tokens."""
    module.eval()
    total = tokens = 0.0
    for batch in batches:
        hidden = module.encoder(
            batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
        )  # (batch, seq, hidden)
        selected = batch["labels"] != IGNORE_INDEX
        loss = F.cross_entropy(module.mlm_head(hidden[selected]), batch["labels"][selected])
        total += float(loss) * int(selected.sum())
        tokens += int(selected.sum())
    return total / tokens


def test_each_source_has_its_heldout_loss_and_compare_shows_it(
    prepared_corpus, docstring_corpus, tmp_path
):
    sources = (
        f"data.sources=[{{name: help, shards_dir: '{prepared_corpus}', weight: 0.7}}, "
        f"{{name: docs, shards_dir: '{docstring_corpus}', weight: 0.3}}]"
    )
    run_dir = tmp_path / "run"
    overrides = cpu_run_overrides(
        prepared_corpus,
        run_dir,
        sources,
        "data.mix_block_samples=10",
        "objective=mlm",
        "data=full_sentences",
        "data.holdout_shards=1",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        "trainer.val_batches=2",
        "trainer.log_every_n_steps=1",
    )
    train(compose_config(overrides))
    rows = val_rows(run_dir)
    assert sorted(rows) == [2, 4]
    run, spec, module_class = build_stream(compose_config(overrides))
    module = module_class(run, spec.vocab)
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    module.load_state_dict(objective_state_dict(state["state_dict"]))
    for source, shards_dir in zip(spec.sources, (prepared_corpus, docstring_corpus), strict=True):
        held = heldout_spec(run, source_spec(spec, source), str(shards_dir))
        assert [Path(p).parent for p in held.shard_paths] == [Path(shards_dir).resolve()]
        assert set(held.shard_paths).isdisjoint(spec.shard_paths)  # never trained on
        batches = heldout_batches(held, 2)
        assert len(batches) == 2
        logged = rows[4][f"val/source/{source.name}/loss"]
        assert logged == pytest.approx(weighed_mlm_loss(module, batches), abs=1e-5)
    assert rows[4]["val/source/help/loss"] != rows[4]["val/source/docs/loss"]

    write_report([run_dir], tmp_path / "report")
    with open(tmp_path / "report" / "summary.csv") as f:
        header, row = list(csv.reader(f))
    final = dict(zip(header, row, strict=True))
    for name in ("help", "docs"):
        assert float(final[f"val/source/{name}/loss"]) == pytest.approx(
            rows[4][f"val/source/{name}/loss"], rel=1e-3
        )
    help_samples, doc_samples = mix_schedule(["help", "docs"], [0.7, 0.3], 10).counts_before(32)
    assert float(final["train/source/help/samples"]) == help_samples  # 4 steps of 8 samples
    assert float(final["train/source/docs/samples"]) == doc_samples
