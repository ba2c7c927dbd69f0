"""`pretrain-generate CKPT_OR_HF_DIR --text "..." [--num-beams N] [--max-new-tokens N]`:
what a trained model writes after (or, for a denoiser, reconstructs from) a text.

Loads a `pretrain` checkpoint (.ckpt) or an exported Hugging Face directory, builds the
objective module and asks it for a `GenerationSetup` (`module.prepare_generation(token_ids)`,
token_ids (1, n) without special tokens): the step function, the prefix, the end token and
the length limit. Any objective that defines `prepare_generation` works here: the causal LM
continues the text; an encoder-decoder encodes it and decodes from its start token; UniLM
writes a target for it under the seq2seq mask. An HF
directory names its objective by config.json's `model_type` (`HF_OBJECTIVES`, from each
objective schema's `hf_generation`); one whose
config.json records an objective that does not generate (an MLM-only BERT), or a BERT that
records none, is refused unless `--allow-any-objective`.
"""

import argparse
import json
from pathlib import Path

import torch
from hydra.utils import get_class
from tokenizers import Tokenizer

from pretrain.cluster.process_exit import console_script
from pretrain.config import component_config
from pretrain.data.vocab import load_vocabulary
from pretrain.errors import report_error
from pretrain.export import ExportError, import_hf_model, read_checkpoint
from pretrain.export.hf import OBJECTIVE_KEY
from pretrain.models.generation import beam_search, greedy_search
from pretrain.objectives.configs import objective_schemas


def hf_objectives() -> dict[str, tuple[str, str]]:
    """Hugging Face model_type -> (the objective class that generates with that family, the
    input format it reads), as each objective's schema declares (`hf_generation`)."""
    return {
        schema.hf_generation[0]: (schema._target_, schema.hf_generation[1])
        for schema in objective_schemas().values()
        if schema.hf_generation is not None
    }


HF_OBJECTIVES = hf_objectives()


# families whose every model generates (any GPT-2 is a causal LM), whatever config.json records
ALWAYS_GENERATE = ("gpt2",)


class GenerationError(RuntimeError):
    """The model cannot generate; the message says why and what to do."""


def check_trained_to_generate(hf_config: dict, config_path: Path) -> None:
    """GenerationError unless the exported model's recorded objective (`OBJECTIVE_KEY`)
    generates (has `prepare_generation`); a BERT that records none (an older export, or not
    this project's) is refused too: most BERTs are MLM encoders, which write noise."""
    recorded = hf_config.get(OBJECTIVE_KEY)
    if recorded is None and hf_config.get("model_type") in ALWAYS_GENERATE:
        return
    generates = False
    if isinstance(recorded, str) and recorded.startswith("pretrain.objectives."):
        try:  # only this project's objectives are imported, never a name from elsewhere
            generates = hasattr(get_class(recorded), "prepare_generation")
        except (ImportError, AttributeError, ValueError):
            pass
    if not generates:
        what = f"objective {recorded}" if recorded else "no objective"
        raise GenerationError(
            f"{config_path}: {OBJECTIVE_KEY} records {what}, not one trained to generate; "
            "pass --allow-any-objective to generate from it anyway"
        )


def load_for_generation(
    source: str | Path, allow_any_objective: bool = False
) -> tuple[torch.nn.Module, Tokenizer]:
    """The objective module (eval mode, CPU) and the tokenizer of a .ckpt or HF directory;
    an HF directory of a model not trained to generate is refused (GenerationError,
    `check_trained_to_generate`) unless `allow_any_objective`."""
    path = Path(source)
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            raise GenerationError(f"{config_path}: not found; is {path} an exported model?")
        hf_config = json.loads(config_path.read_text())
        model_type = hf_config.get("model_type")
        if model_type not in HF_OBJECTIVES:
            raise GenerationError(
                f"{path / 'config.json'}: model_type {model_type!r} has no generating objective; "
                f"supported: {', '.join(sorted(HF_OBJECTIVES))}"
            )
        if not allow_any_objective:
            check_trained_to_generate(hf_config, config_path)
        model_cfg, state_dict = import_hf_model(path)
        target, data_format = HF_OBJECTIVES[model_type]
        data = {"format": data_format}  # of at most the model's length
        longest = component_config("model", model_cfg).max_sequence_tokens
        if longest is not None:
            data["max_seq_length"] = longest
        config = {"seed": 0, "model": model_cfg, "objective": {"_target_": target}, "data": data}
        tokenizer_dir = path
    else:
        state_dict, config = read_checkpoint(path)
        target = config["objective"]["_target_"]
        tokenizer_dir = Path(config["data"]["tokenizer_dir"])
    module_class = get_class(target)
    if not hasattr(module_class, "prepare_generation"):
        raise GenerationError(
            f"{source}: objective {target} does not generate (it has no prepare_generation); "
            "use a causal LM or encoder-decoder checkpoint"
        )
    try:
        vocab = load_vocabulary(tokenizer_dir)
    except ValueError as error:
        raise GenerationError(str(error)) from error
    module = module_class(config, vocab)
    missing = module.load_state_dict(state_dict, strict=False).missing_keys
    if missing:
        raise GenerationError(f"{source}: lacks the weights {missing[:3]}")
    return module.eval(), Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))


@torch.no_grad()
def generate_text(
    module: torch.nn.Module,
    tokenizer: Tokenizer,
    text: str,
    num_beams: int = 1,
    max_new_tokens: int = 40,
    length_penalty: float = 1.0,
) -> str:
    """The text the model generates for `text` (greedy for num_beams=1, else beam search);
    special tokens are left out of the decoded text."""
    ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False).ids], dtype=torch.long)
    setup = module.prepare_generation(ids)
    prompt_len = setup.prefix.shape[1]
    if setup.max_length is not None:
        max_new_tokens = min(max_new_tokens, setup.max_length - prompt_len)
        if max_new_tokens < 1:
            raise GenerationError(
                f"the text is {prompt_len} tokens with its special tokens; the model takes "
                f"{setup.max_length}: shorten it"
            )
    if num_beams == 1:
        out = greedy_search(setup.step, setup.prefix, max_new_tokens, setup.eos_id)
    else:
        out = beam_search(
            setup.step, setup.prefix, num_beams, max_new_tokens, setup.eos_id, length_penalty
        )
    return tokenizer.decode(out[0, prompt_len:].tolist(), skip_special_tokens=True)


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit status (2 with a message on an error)."""
    parser = argparse.ArgumentParser(prog="pretrain-generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="a .ckpt written by `pretrain` or an exported HF directory")
    parser.add_argument("--text", action="append", required=True, help="prompt (repeatable)")
    parser.add_argument("--num-beams", type=int, default=1, help="1 = greedy search")
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--length-penalty", type=float, default=1.0)
    parser.add_argument(
        "--allow-any-objective",
        action="store_true",
        help="generate from an exported model whose config.json records an objective that was "
        "not trained to generate (an MLM-only BERT), or none",
    )
    args = parser.parse_args(argv)
    if args.num_beams < 1 or args.max_new_tokens < 1:
        parser.error("--num-beams and --max-new-tokens must be at least 1")
    try:
        module, tokenizer = load_for_generation(args.source, args.allow_any_objective)
        for text in args.text:
            out = generate_text(
                module, tokenizer, text, args.num_beams, args.max_new_tokens, args.length_penalty
            )
            print(f"{text} => {out}")
    except (GenerationError, ExportError) as error:
        report_error(error, "pretrain-generate")
        return 2
    return 0


console_main = console_script(main)  # `main`, then the process ends (pretrain.cluster.process_exit)


if __name__ == "__main__":
    console_main()
