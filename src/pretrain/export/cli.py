"""`pretrain-export <checkpoint> <out_dir> [--overwrite]`: a checkpoint -> a Hugging Face directory."""

import argparse

from pretrain.cluster.process_exit import console_script
from pretrain.errors import report_error
from pretrain.export.checkpoint import ExportError
from pretrain.export.hf import export_checkpoint


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (`argv` defaults to sys.argv[1:])."""
    parser = argparse.ArgumentParser(
        prog="pretrain-export",
        description="Export a `pretrain` BERT checkpoint to a Hugging Face directory "
        "(config.json, model.safetensors, tokenizer files).",
    )
    parser.add_argument("checkpoint", help="path of a .ckpt written by `pretrain`")
    parser.add_argument(
        "out_dir", help="directory to create; loads with transformers' from_pretrained"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace out_dir if it is not empty"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the export; returns the exit status (0 on success, 1 with a message on stderr)."""
    args = parse_args(argv)
    try:
        out = export_checkpoint(args.checkpoint, args.out_dir, overwrite=args.overwrite)
    except ExportError as error:
        report_error(error, "pretrain-export")
        return 1
    print(f"pretrain-export: wrote {out}")
    return 0


console_main = console_script(main)  # `main`, then the process ends (pretrain.cluster.process_exit)


if __name__ == "__main__":
    console_main()
