"""Which optimizer and LayerNorm kernels a run uses: NVIDIA apex's fused ones when apex is
importable with its CUDA extensions (the CUDA image builds it), torch's otherwise. Chosen by `optim.impl` and `model.layer_norm_impl`, each auto | torch | apex:

- auto: apex on a CUDA device when apex is there, else torch;
- torch: torch's own (an AdamW/Adam on CUDA gets `fused=True`; LayerNorm is nn.LayerNorm);
- apex: apex's, or an error naming the key when apex or a CUDA device is missing.

apex's optimizers: FusedAdam (for torch.optim.AdamW in AdamW mode, torch.optim.Adam in L2
mode) and FusedLAMB (for pytorch_optimizer.Lamb; its own gradient clipping is off, Lightning
clips per trainer.gradient_clip_val as on the torch path). torch's implementation switches
(`fused`, `foreach`, ...) are not passed to apex. Outside DeepSpeed, FusedAdam is built
`capturable` (but under fp16, whose GradScaler skips steps itself): its learning rate and
step count live on the device and it skips a step on the device when told through its
`grad_scaler` argument (`nonfinite.device_skip`), as torch's fused AdamW does with
`found_inf`. apex's FusedLayerNorm takes over each nn.LayerNorm's
parameters, so checkpoints and exports keep their names.

With DeepSpeed's optimizer offload (`strategy.offload_optimizer`) the optimizer steps on CPU
partitions, where apex cannot run: an AdamW/Adam becomes DeepSpeed's DeepSpeedCPUAdam on a
CUDA run whose CPU Adam op can be built, torch's otherwise; `optim.impl=apex` is refused.
"""

import importlib.util
from typing import Any

import torch

from pretrain.errors import ConfigError
from pretrain.models.configs import KERNEL_IMPLS as IMPLS

# the optimizer a config names -> (apex's, the settings that make it compute the same update)
APEX_OPTIMIZERS: dict[str, tuple[str, dict[str, Any]]] = {
    "torch.optim.AdamW": ("apex.optimizers.FusedAdam", {"adam_w_mode": True}),
    "torch.optim.Adam": ("apex.optimizers.FusedAdam", {"adam_w_mode": False}),
    "pytorch_optimizer.Lamb": ("apex.optimizers.FusedLAMB", {"max_grad_norm": float("inf")}),
}
TORCH_FUSED = ("torch.optim.AdamW", "torch.optim.Adam")  # take fused=True on CUDA
# torch's implementation switches, which apex's and DeepSpeed's optimizers do not take
TORCH_ONLY_KEYS = ("fused", "foreach", "capturable", "differentiable")
CPU_ADAM = "deepspeed.ops.adam.DeepSpeedCPUAdam"


def apex_extension_available(extension: str) -> bool:
    """True when apex and its compiled CUDA extension `extension` (e.g. amp_C,
    fused_layer_norm_cuda) can be imported (a Python-only apex build has neither)."""
    try:
        return (
            importlib.util.find_spec("apex") is not None
            and importlib.util.find_spec(extension) is not None
        )
    except (ImportError, ValueError):
        return False


def use_apex(key: str, impl: str, device: torch.device, extension: str) -> bool:
    """Whether `key` (= `impl`) selects apex on `device`; ConfigError when apex is asked for
    and cannot run (not installed with `extension`, or not a CUDA device)."""
    if impl not in IMPLS:
        raise ConfigError(f"{key} = {impl!r}: must be one of {', '.join(IMPLS)}")
    available = apex_extension_available(extension)
    if impl == "apex":
        if not available:
            raise ConfigError(
                f"{key}=apex: apex with its CUDA extension {extension} is not installed here; "
                f"build it (docker/Dockerfile.cuda) or set {key}=auto or {key}=torch"
            )
        if device.type != "cuda":
            raise ConfigError(
                f"{key}=apex: apex's fused kernels run on CUDA only, this run is on "
                f"{device.type}; set {key}=auto or {key}=torch"
            )
    return impl == "apex" or (impl == "auto" and available and device.type == "cuda")


def optimizer_settings(
    optimizer: dict,
    impl: str,
    device: torch.device,
    strategy: Any = None,
    precision: str = "32-true",
) -> tuple[dict, str]:
    """The `optim.optimizer` partial to instantiate under `optim.impl` = `impl` on `device`
    with `strategy` (the typed strategy section; None: not DeepSpeed) and
    `trainer.precision` = `precision`, and a line saying which implementation that is."""
    target = optimizer["_target_"]
    settings = dict(optimizer)
    deepspeed = strategy is not None and strategy.name == "deepspeed"
    fp16 = str(precision) in ("16-mixed", "16")  # GradScaler skips (Lightning would not clip)
    if deepspeed and strategy.offload_optimizer:
        return offload_settings(settings, impl, device)
    if target in APEX_OPTIMIZERS and use_apex("optim.impl", impl, device, "amp_C"):
        apex_target, fixed = APEX_OPTIMIZERS[target]
        settings = {k: v for k, v in settings.items() if k not in TORCH_ONLY_KEYS}
        settings.update(fixed, _target_=apex_target)
        if apex_target == "apex.optimizers.FusedAdam" and not (deepspeed or fp16):
            settings["capturable"] = True  # skips on the device (nonfinite.device_skip)
        return settings, f"optimizer: {apex_target} (apex, for {target})"
    if impl == "apex":
        raise ConfigError(
            f"optim.impl=apex: apex has no optimizer for {target} (it has one for "
            f"{', '.join(APEX_OPTIMIZERS)}); set optim.impl=auto or optim.impl=torch"
        )
    use_apex("optim.impl", impl, device, "amp_C")  # checks the value
    if target in TORCH_FUSED and device.type == "cuda":
        settings.setdefault("fused", True)
    fused = " (fused)" if settings.get("fused") else ""
    return settings, f"optimizer: {target}{fused} (torch)"


def offload_settings(settings: dict, impl: str, device: torch.device) -> tuple[dict, str]:
    """The optimizer partial under DeepSpeed's optimizer offload, which steps on CPU
    partitions: DeepSpeedCPUAdam for an AdamW/Adam on a CUDA run whose CPU Adam op builds
    (`cpu_adam_available`), else the configured torch optimizer; never apex's."""
    if impl == "apex":
        raise ConfigError(
            "optim.impl=apex: strategy.offload_optimizer steps the optimizer on the CPU, where "
            "apex cannot run; set optim.impl=auto or optim.impl=torch"
        )
    use_apex("optim.impl", impl, device, "amp_C")  # checks the value
    target = settings["_target_"]
    if target in TORCH_FUSED and device.type == "cuda" and cpu_adam_available():
        settings = {k: v for k, v in settings.items() if k not in TORCH_ONLY_KEYS}
        settings.update(_target_=CPU_ADAM, adamw_mode=target == "torch.optim.AdamW")
        return settings, f"optimizer: {CPU_ADAM} (DeepSpeed, offloaded, for {target})"
    return settings, f"optimizer: {target} (torch, offloaded)"


def cpu_adam_available() -> bool:
    """True when DeepSpeed's CPU Adam op is prebuilt or can be built here (a C++ toolchain)."""
    try:
        from deepspeed.ops.op_builder import CPUAdamBuilder

        return bool(CPUAdamBuilder().is_compatible(verbose=False))
    except Exception:  # noqa: BLE001 - no DeepSpeed, or its builder cannot tell: torch's
        return False


def use_layer_norm_impl(module: torch.nn.Module, impl: str, device: torch.device) -> str:
    """Swap every nn.LayerNorm in `module` for apex's FusedLayerNorm when `model.layer_norm_impl`
    = `impl` selects apex on `device` (the same parameters, so the same names and values);
    returns a line saying which LayerNorm the run uses."""
    if not use_apex("model.layer_norm_impl", impl, device, "fused_layer_norm_cuda"):
        return "layer norm: torch.nn.LayerNorm (torch)"
    from apex.normalization import FusedLayerNorm

    swapped = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.LayerNorm and child.bias is not None:
                fused = FusedLayerNorm(child.normalized_shape, eps=child.eps)
                fused.weight, fused.bias = child.weight, child.bias
                setattr(parent, name, fused)
                swapped += 1
    return f"layer norm: apex.normalization.FusedLayerNorm (apex, {swapped} modules)"


def layer_norm_choice(impl: str, precision: str) -> str:
    """model.layer_norm_impl as used under Lightning's `precision`: `auto` under mixed
    precision is torch's LayerNorm, which autocast keeps in fp32 (apex's FusedLayerNorm casts
    its input and weights to the autocast dtype: BERT's post-LN residual stream in bf16);
    `apex` is honoured as asked. README: model.layer_norm_impl."""
    return "torch" if impl == "auto" and precision.endswith("-mixed") else impl


def report_kernel(trainer, part: str, choice: str) -> None:
    """Print which kernels `part` uses (once, rank 0) and log it with the hyperparameters."""
    if not trainer.is_global_zero:
        return
    print(choice, flush=True)
    for logger in trainer.loggers:
        logger.log_hyperparams({f"kernels/{part}": choice.split(": ", 1)[1]})
