"""Renaming machinery shared by the export modules: our parameter names <-> Hugging Face's,
and the checks that a config names every key a conversion needs.

A family's names are a list of rules `(our regex, HF replacement)`, e.g.
`(r"encoder\\.layers\\.(\\d+)\\.output\\.(weight|bias)", r"bert.encoder.layer.\\1.output.dense.\\2")`;
`invert` turns them into `(HF regex, our replacement)` for the way back. A fused q,k,v
projection (one tensor for us, three for HF) is described by a `FusedQKV`.
"""

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from pretrain.export.checkpoint import ExportError

Rules = list[tuple[str, str]]


def rename(key: str, rules: Rules) -> str | None:
    """`key` renamed by the first rule whose regex matches all of it; None when none does."""
    for pattern, replacement in rules:
        if re.fullmatch(pattern, key):
            return re.sub(pattern, replacement, key)
    return None


def _invert_rule(pattern: str, replacement: str) -> tuple[str, str]:
    """Swap one (our regex, HF replacement) rule into (HF regex, our replacement). The
    replacement must use its groups in order (`\\1`, then `\\2` ...), each group once."""
    groups = iter(re.findall(r"\(.*?\)", pattern))
    hf_pattern = re.sub(r"\\\\(\d)", lambda _: next(groups), re.escape(replacement))
    count = iter(range(1, 10))
    ours = re.sub(r"\(.*?\)", lambda _: f"\\{next(count)}", pattern).replace("\\.", ".")
    return hf_pattern, ours


def invert(rules: Rules) -> Rules:
    """The rules of the way back: (HF regex, our replacement) for each (our regex, HF name)."""
    return [_invert_rule(pattern, replacement) for pattern, replacement in rules]


def renamed(weights: Mapping[str, torch.Tensor], rules: Rules) -> dict[str, torch.Tensor]:
    """`weights` under the names `rules` give them; names no rule matches are dropped."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        new_name = rename(name, rules)
        if new_name is not None:
            out[new_name] = tensor
    return out


SENTENCE_HEAD = "sentence_head."  # the objectives' sentence-relation head (NSP, SOP, ...)


def exported_heads(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state_dict` with the sentence head as Hugging Face's pretraining models have one:
    `sentence_head.*`, left out unless it is a 2-way head (NSP, SOP): StructBERT's three-way
    task has no Hugging Face head. `state_dict` is under the objective's names
    (`pretrain.checkpoint.compat.objective_state_dict`)."""
    out = dict(state_dict)
    classifier = SENTENCE_HEAD + "classifier.weight"
    if classifier in out and out[classifier].shape[0] != 2:
        out = {key: tensor for key, tensor in out.items() if not key.startswith(SENTENCE_HEAD)}
    return out


def without_compile_prefix(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state_dict` without torch.compile's `_orig_mod.` (its keys name the same weights)."""
    return {key.replace("_orig_mod.", ""): value for key, value in state_dict.items()}


def check_tied(
    state_dict: Mapping[str, torch.Tensor], decoder: str, embeddings: str, reason: str
) -> None:
    """ValueError "`decoder` differs from `embeddings`; `reason`" when both are present and
    differ: the exported model ties them, so it could not hold the decoder."""
    tensor, tied_to = state_dict.get(decoder), state_dict.get(embeddings)
    if tensor is not None and tied_to is not None and not torch.equal(tensor, tied_to):
        raise ValueError(f"{decoder} differs from {embeddings}; {reason}")


def cpu_copies(weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached, contiguous, unshared CPU copies of `weights` (safetensors refuses shared or
    strided storage, and tied names share theirs)."""
    return {
        name: tensor.detach().to("cpu").clone().contiguous() for name, tensor in weights.items()
    }


def _template_pattern(template: str, parts: tuple[str, ...]) -> re.Pattern:
    """A regex matching the names `template` makes, with named groups for its fields."""
    fields = {"layer": r"\d+", "kind": "weight|bias", "part": "|".join(parts)}
    pattern = re.escape(template)
    for field, alternatives in fields.items():
        pattern = pattern.replace(re.escape(f"{{{field}}}"), f"(?P<{field}>{alternatives})")
    return re.compile(pattern)


@dataclass(frozen=True)
class FusedQKV:
    """Where a fused q,k,v projection lives: `ours` names the fused tensor, `hf` each of its
    three parts (stacked along dim 0 in `parts` order). Templates take `{layer}` (a block
    number) and `{kind}` (weight or bias); `hf` also `{part}`, one of `parts`."""

    ours: str
    hf: str
    parts: tuple[str, str, str] = ("query", "key", "value")

    def split(self, key: str, tensor: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """HF's three (hidden, ...) parts of our fused (3 * hidden, ...) tensor named `key`,
        or None when `key` is not a fused projection."""
        match = _template_pattern(self.ours, self.parts).fullmatch(key)
        if match is None:
            return None
        pieces = zip(self.parts, tensor.chunk(3, dim=0), strict=True)
        return {self.hf.format(part=part, **match.groupdict()): piece for part, piece in pieces}

    def join(self, weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Our fused tensors, each the concatenation of its three parts among HF's `weights`;
        KeyError when a part is missing."""
        pattern = _template_pattern(self.hf, self.parts)
        found: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in weights.items():
            match = pattern.fullmatch(name)
            if match:
                where = {k: v for k, v in match.groupdict().items() if k != "part"}
                found.setdefault(self.ours.format(**where), {})[match["part"]] = tensor
        return {
            key: torch.cat([parts[part] for part in self.parts], dim=0)
            for key, parts in found.items()
        }


def to_hf_names(
    state_dict: Mapping[str, torch.Tensor],
    rules: Rules,
    prefixes: tuple[str, ...],
    unknown: str,
    qkv: FusedQKV | None = None,
    skip: tuple[str, ...] = (),
) -> dict[str, torch.Tensor]:
    """The tensors of `state_dict` whose key starts with one of `prefixes` (but for those in
    `skip`), under HF's names: fused q,k,v projections split by `qkv`, the others renamed by
    `rules`. A key no rule matches raises ValueError(`unknown` formatted with `key`)."""
    hf: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        if not key.startswith(prefixes) or key in skip:
            continue
        parts = qkv.split(key, tensor) if qkv is not None else None
        if parts is not None:
            hf.update(parts)
            continue
        name = rename(key, rules)
        if name is None:
            raise ValueError(unknown.format(key=key))
        hf[name] = tensor
    return hf


def require_model_keys(model_cfg: Mapping, keys: Iterable[str]) -> None:
    """ExportError naming the first of `keys` that the run's `model` config group lacks."""
    missing = [key for key in keys if key not in model_cfg]
    if missing:
        raise ExportError(f"config.model lacks the key {missing[0]!r}, needed for config.json")


def require_hf_keys(hf_config: Mapping, keys: Iterable[str], family: str) -> None:
    """ExportError naming the first of `keys` that a config.json lacks: "not `family` config"
    (e.g. family="a BERT")."""
    missing = [key for key in keys if key not in hf_config]
    if missing:
        raise ExportError(f"config.json lacks {missing[0]!r}: not {family} config")
