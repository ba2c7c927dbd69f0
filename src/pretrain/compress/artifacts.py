"""The files a compressed model ships as, and their loading in a process without this project.

Every artifact is a whole masked-LM model, (input_ids, token_type_ids, attention_mask), each
(batch, seq) int64, -> (batch, seq, vocab) float32 MLM logits, in one of three formats:

    model.safetensors  transformers   AutoModelForMaskedLM.from_pretrained(dir)(**inputs).logits
    model.ts           TorchScript    torch.jit.load(path)(ids, types, mask)
    model.pt2          torch.export   torch.export.load(path).module()(ids, types, mask)

int8 ships as TorchScript: torch's dynamic int8 Linear holds its weights as a packed
TorchScript object (`LinearPackedParamsBase`), which `torch.export` cannot trace (torch 2.13:
no `__obj_flatten__`) and TorchScript saves and re-packs on load. A head-pruned model ships
as a `torch.export` program: transformers 5 builds every layer with the config's head count.
`load_fresh` proves a file loads without this project: a new interpreter (`python -I`, no
PYTHONPATH, no working directory on the path) in which importing `pretrain` raises.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import Tensor, nn

from pretrain.errors import ConfigError

SAFETENSORS, TORCHSCRIPT, PROGRAM = "model.safetensors", "model.ts", "model.pt2"
RUNTIMES = {
    SAFETENSORS: "transformers",
    TORCHSCRIPT: "torch (TorchScript)",
    PROGRAM: "torch (torch.export)",
}
INPUT_NAMES = ("input_ids", "token_type_ids", "attention_mask")

# Run by `python -I -c`: argv = artifact, inputs.pt, logits.pt. Only torch (and transformers
# for a safetensors directory) are imported; `pretrain` cannot be.
LOADER = """
import sys
class NoPretrain:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "pretrain":
            raise ImportError("pretrain is not importable in this process")
sys.meta_path.insert(0, NoPretrain())
import torch
artifact, inputs_path, out_path = sys.argv[1:4]
x = torch.load(inputs_path)
args = (x["input_ids"], x["token_type_ids"], x["attention_mask"])
with torch.no_grad():
    if artifact.endswith(".ts"):
        logits = torch.jit.load(artifact)(*args)
    elif artifact.endswith(".pt2"):
        logits = torch.export.load(artifact).module()(*args)
    else:
        from transformers import AutoModelForMaskedLM
        model = AutoModelForMaskedLM.from_pretrained(artifact.rsplit("/", 1)[0]).eval()
        logits = model(**x).logits
assert "pretrain" not in sys.modules
torch.save(logits, out_path)
"""


class ArtifactError(ConfigError):
    """A shipped file that does not load, or does not run, outside this project."""


class MaskedLMLogits(nn.Module):
    """A transformers *ForMaskedLM as (ids, types, mask) -> (batch, seq, vocab) logits, with a
    `hidden_states` method: the same -> (batch, seq, hidden) last-layer states."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.model(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask
        ).logits

    def hidden_states(
        self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor
    ) -> Tensor:
        return self.model.base_model(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask
        ).last_hidden_state


def example_inputs(vocab_size: int, batch: int = 2, seq_len: int = 16) -> tuple[Tensor, ...]:
    """(input_ids, token_type_ids, attention_mask), each (batch, seq_len) int64, ids drawn
    from [5, vocab_size) by a fixed generator: what artifacts are traced and timed with."""
    generator = torch.Generator().manual_seed(batch * 1000 + seq_len)
    ids = torch.randint(5, vocab_size, (batch, seq_len), generator=generator)
    return ids, torch.zeros_like(ids), torch.ones_like(ids)


def save_torchscript(model: nn.Module, path: Path, vocab_size: int) -> Path:
    """Trace a transformers *ForMaskedLM `model` (fp32 or torch dynamic int8) with its
    `forward` (logits) and `hidden_states` methods and save it to `path`; returns `path`.
    The trace holds for any batch and sequence length (checked by the tests)."""
    wrapped = MaskedLMLogits(model).eval()
    inputs = example_inputs(vocab_size)
    with torch.no_grad():
        traced = torch.jit.trace_module(
            wrapped, {"forward": inputs, "hidden_states": inputs}, strict=False
        )
    torch.jit.save(traced, str(path))
    return path


def save_program(model: nn.Module, path: Path, vocab_size: int, max_seq_length: int) -> Path:
    """`torch.export` `model`, (ids, types, mask) -> logits, with dynamic batch (1-1024) and
    sequence (2-`max_seq_length`) sizes, to `path`; returns `path`."""
    from torch.export import Dim

    batch, seq = Dim("batch", min=1, max=1024), Dim("seq", min=2, max=max_seq_length)
    with torch.no_grad():
        program = torch.export.export(
            model.eval(), example_inputs(vocab_size), dynamic_shapes=({0: batch, 1: seq},) * 3
        )
    torch.export.save(program, path)
    return path


def load_artifact(path: str | Path) -> nn.Module:
    """The model of a shipped file (see the module docstring), in this process, as a callable
    (ids, types, mask) -> logits."""
    path = Path(path)
    if path.name == TORCHSCRIPT:
        return torch.jit.load(str(path)).eval()
    if path.name == PROGRAM:
        return torch.export.load(path).module()
    if path.name == SAFETENSORS:
        from transformers import AutoModelForMaskedLM

        model = AutoModelForMaskedLM.from_pretrained(str(path.parent), local_files_only=True)
        return MaskedLMLogits(model.eval())
    raise ArtifactError(f"{path}: not a shipped model file (one of {', '.join(RUNTIMES)})")


def shipped_file(directory: str | Path) -> Path:
    """The file a compressed directory ships: model.ts, else model.pt2, else model.safetensors."""
    for name in (TORCHSCRIPT, PROGRAM, SAFETENSORS):
        if (Path(directory) / name).is_file():
            return Path(directory) / name
    raise ArtifactError(f"{directory}: no {', '.join(RUNTIMES)}; write it with pretrain-compress")


def load_fresh(path: str | Path, inputs: dict[str, Tensor], timeout_s: float = 300) -> Tensor:
    """The logits of the shipped file `path` on `inputs` (ids, types, mask), computed by a new
    interpreter that cannot import this project (it runs in a scratch directory: a relative
    `path` is resolved here first); raises ArtifactError with its last error line."""
    with tempfile.TemporaryDirectory() as scratch:
        inputs_path, out_path = Path(scratch) / "inputs.pt", Path(scratch) / "logits.pt"
        torch.save({name: inputs[name] for name in INPUT_NAMES}, inputs_path)
        env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        shipped = str(Path(path).resolve())
        command = [sys.executable, "-I", "-c", LOADER, shipped, str(inputs_path), str(out_path)]
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=timeout_s, cwd=scratch
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ArtifactError(f"{path}: does not load without pretrain: {last}")
        return torch.load(out_path)
