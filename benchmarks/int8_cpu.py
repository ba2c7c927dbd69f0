"""Why int8 is or is not faster on this CPU: one BERT encoder (random weights, `width` wide,
`layers` layers, 4x feed-forward) at batch 32 x 128 tokens, one thread, under each variant,
timed in turn for 5 rounds after warm-up (medians), as throughput over the first variant.

    .venv/bin/python benchmarks/int8_cpu.py 128 2 fp32,ao,aowo,x86,onednn
    .venv/bin/python benchmarks/int8_cpu.py 128 2 fp32,ao,fp32_compile,ao_compile

Variants: fp32; ao = torchao Int8DynamicActivationInt8WeightConfig (what `pretrain-compress
method=int8` writes); aowo = torchao Int8WeightOnlyConfig; x86 / onednn / fbgemm = torch's
own `torch.ao.quantization.quantize_dynamic` with that `torch.backends.quantized.engine`;
a `_compile` suffix runs the variant under `torch.compile` (compile time excluded). Never a
test: times are printed, never asserted.
"""

import logging
import statistics
import sys
import time
import warnings

import torch
from torch import nn


def build(variant: str, config, ids: torch.Tensor, mask: torch.Tensor):
    """A no-argument callable running the encoder of `variant` on (ids, mask)."""
    from transformers import BertModel

    model = BertModel(config).eval()
    kind = variant.removesuffix("_compile")
    if kind in ("ao", "aowo"):
        from torchao.quantization import (
            Int8DynamicActivationInt8WeightConfig,
            Int8WeightOnlyConfig,
            quantize_,
        )

        quant = (
            Int8WeightOnlyConfig() if kind == "aowo" else Int8DynamicActivationInt8WeightConfig()
        )
        quantize_(model, quant, filter_fn=lambda module, _: isinstance(module, nn.Linear))
    elif kind != "fp32":
        torch.backends.quantized.engine = kind
        model = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    run = torch.compile(model) if variant.endswith("_compile") else model

    def forward():
        if kind not in ("fp32", "ao", "aowo"):
            torch.backends.quantized.engine = kind
        return run(input_ids=ids, attention_mask=mask).last_hidden_state

    return forward


def main(argv: list[str]) -> None:
    from transformers import BertConfig
    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore")
    logging.getLogger("torchao").setLevel(logging.ERROR)
    hf_logging.set_verbosity_error()
    torch.set_num_threads(1)
    width, layers, variants = int(argv[0]), int(argv[1]), argv[2].split(",")
    config = BertConfig(
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=max(2, width // 64),
        intermediate_size=4 * width,
        vocab_size=4000,
    )
    ids = torch.randint(5, 4000, (32, 128))
    mask = torch.ones_like(ids)
    runs, times = {}, {v: [] for v in variants}
    with torch.no_grad():
        for variant in variants:
            runs[variant] = build(variant, config, ids, mask)
            runs[variant]()  # warm-up (and compile)
        for _ in range(5):
            for variant in variants:
                start = time.perf_counter()
                runs[variant]()
                times[variant].append(time.perf_counter() - start)
    base = statistics.median(times[variants[0]])
    print(f"torch {torch.__version__}, width {width}, {layers} layers, batch 32 x 128, 1 thread")
    for variant in variants:
        median = statistics.median(times[variant])
        print(f"{variant:>14}: {32 / median:7.1f} seq/s  {base / median:.2f}x of {variants[0]}")


if __name__ == "__main__":
    main(sys.argv[1:])
