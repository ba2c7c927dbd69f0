"""Downstream evaluation of a pretrained encoder (`pretrain-eval`): fine-tuning, feature-based
probing (frozen encoder) and extractive QA on local task files or the built-in tasks.

    encoder.py        a checkpoint or exported Hugging Face directory -> model + tokenizer
    tasks.py          task examples and kinds (classification, pair, regression, qa, tagging)
    builtin_tasks.py  tasks generated from the built-in corpus (no download)
    formats.py        GLUE-style TSV, SQuAD JSON, JSONL/CSV loaders
    features.py       examples -> token tensors (QA windows with a document stride)
    heads.py          layer choice (last, second-to-last, concat last 4, scalar mix), pooling
    module.py         the Lightning module that fine-tunes or probes
    metrics.py        task metrics from torchmetrics, QA span decoding
    run.py            one evaluation from a composed config (its Hydra main, the console
                      script, is `pretrain.cli.evaluate`)
    config.py         the typed schema of conf/evaluate.yaml and the eval/ group
    results.py        one table of many eval/*.json (a sweep)
    demo.py           `make demo-eval`: the demo model against a random encoder
"""
