"""`pretrain-compress`: make a pretrained BERT smaller and write the result as a Hugging Face
directory with its report (`<out_dir>/compression.json`).

    pretrain-compress teacher=exports/demo-bert method=tinybert student=tinybert_demo
    pretrain-compress teacher=exports/demo-bert method=int8 out_dir=exports/demo-int8
    pretrain-compress teacher=runs/x/checkpoints/last.ckpt method=prune_heads method.head_fraction=0.25

Methods (conf/compress/method/): tinybert, int8, int8_qat, prune_heads, prune_magnitude,
prune_movement. Exit status 2 on a config or data error (one line naming the key or file).
"""

import sys

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pretrain.cluster.process_exit import console_script
from pretrain.compress.config import register_compress_schema
from pretrain.errors import ConfigError
from pretrain.paths import CONF_DIR

register_compress_schema()
COMPRESS_CONF = CONF_DIR / "compress"


def compress(cfg: DictConfig) -> dict:
    """The task Hydra runs: validate, run the method named by `method._target_`, print its
    report's key figures; exits 2 with one line on a config or data error."""
    from hydra.utils import get_method

    from pretrain.export import ExportError

    try:
        run = OmegaConf.to_object(cfg)
        report = get_method(run.method._target_)(run)
    except OmegaConfBaseException as error:
        print(f"pretrain-compress: {error.full_key}: {error.msg}", file=sys.stderr)
        sys.exit(2)
    except (ConfigError, ExportError) as error:
        print(f"pretrain-compress: {error}", file=sys.stderr)
        sys.exit(2)
    figures = {k: v for k, v in report.items() if isinstance(v, float)}
    print(f"{report['method']}: " + "  ".join(f"{k} {v:.4g}" for k, v in figures.items()))
    print(f"Wrote {run.out_dir}")
    return report


hydra_main = hydra.main(config_path=str(COMPRESS_CONF), config_name="compress", version_base="1.3")(
    compress
)


def compose_compress(overrides: list[str] | None = None) -> DictConfig:
    """conf/compress/compress.yaml composed with Hydra `overrides`, outside a Hydra app."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(COMPRESS_CONF), version_base="1.3"):
        return compose(config_name="compress", overrides=list(overrides or []))


def main() -> None:
    """The console script (Hydra's command line: overrides, --help, --cfg job)."""
    hydra_main()


console_main = console_script(main)  # `main`, then the process ends (pretrain.cluster.process_exit)


if __name__ == "__main__":
    console_main()
