"""Making a pretrained BERT small (`pretrain-compress`): TinyBERT layer-wise distillation
into a narrower, shallower student, int8 quantization through torchao (post-training dynamic
and Q8BERT-style quantization-aware fine-tuning), and pruning (attention heads by importance,
weights by magnitude or movement). Every method reads a `pretrain` checkpoint or a Hugging
Face export and writes a Hugging Face directory (or, for int8, a torchao state and a
`torch.export` program) that `pretrain-eval` and `benchmarks/compression.py` read.
"""
