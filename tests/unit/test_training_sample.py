"""The tokenizer's training text of a large corpus: at most the budget, every source its share,
read from the sources' beginnings (the rest of the corpus is not read)."""

from data_pipelines.prepare import source_quotas, training_documents
from data_pipelines.prepare_config import PrepareConfig, TokenizerSettings


def test_quotas_share_the_budget_by_stored_size():
    assert source_quotas([3_000_000, 1_000_000], 2.0) == [1_500_000, 500_000]
    assert source_quotas([3_000_000, 1_000_000], 4.0) == [None, None]  # all of a small corpus
    assert source_quotas([3_000_000, 1_000_000], None) == [None, None]


def test_training_documents_are_each_sources_first_up_to_its_quota(tmp_path):
    big, small = tmp_path / "big.txt", tmp_path / "small.txt"
    big.write_text("".join(f"big document {i:05d} {'x' * 80}\n\n" for i in range(3000)))
    small.write_text("".join(f"small document {i:05d} {'y' * 80}\n\n" for i in range(1000)))
    names = [str(big), str(small)]
    sizes = [big.stat().st_size, small.stat().st_size]
    cfg = PrepareConfig(inputs=names, tokenizer=TokenizerSettings(train_megabytes=0.1))
    documents = list(training_documents(cfg, names))
    quotas = source_quotas(sizes, 0.1)
    for name, quota in zip(names, quotas, strict=True):
        mine = [d for d in documents if d.source == name]
        assert [d.index for d in mine] == list(range(len(mine)))  # the first ones, in order
        taken = sum(len(d.text.encode()) for d in mine)
        assert quota <= taken < quota + 100  # up to the quota, one document over at most
    assert len(documents) < 4000 / 3
    everything = PrepareConfig(inputs=names, tokenizer=TokenizerSettings(train_megabytes=None))
    assert len(list(training_documents(everything, names))) == 4000
