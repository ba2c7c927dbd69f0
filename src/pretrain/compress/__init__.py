"""Making a pretrained BERT small (`pretrain-compress`): TinyBERT layer-wise distillation
into a narrower, shallower student, torch's dynamic int8 quantization (post-training, or after
Q8BERT-style quantization-aware fine-tuning with torchao's fake quantizers), and pruning
(attention heads by importance, weights by magnitude or movement). Every method reads a
`pretrain` checkpoint or a Hugging Face export and writes a Hugging Face directory (int8: a
TorchScript `model.ts`; head pruning: also a `torch.export` program `model.pt2`) that
`pretrain-eval` and `benchmarks/compression.py` read; `retention` measures what each keeps of
its teacher's fine-tuned accuracy.
"""
