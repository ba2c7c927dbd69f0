"""apex.optimizers.FusedAdam with apex's signatures (apex/optimizers/fused_adam.py): `__init__`,
`zero_grad(self)` (no set_to_none), `step(closure=None, ..., grad_scaler=None)`, and in
capturable mode `_step_supports_amp_scaling`, a learning rate and step count held as device
tensors, and a step skipped on the device when `grad_scaler._check_inf_per_device(self)`
flags it (apex's capturable kernel returns when its overflow buffer is set). The update is
apex's Adam (L2 mode) or AdamW (adam_w_mode), computed with torch ops in float32."""

import torch


class FusedAdam(torch.optim.Optimizer):
    """apex's FusedAdam (see the module docstring); runs on any device."""

    def __init__(
        self,
        params,
        lr=1e-3,
        bias_correction=True,
        betas=(0.9, 0.999),
        eps=1e-8,
        adam_w_mode=True,
        weight_decay=0.0,
        amsgrad=False,
        set_grad_none=True,
        capturable=False,
        master_weights=False,
    ):
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        if master_weights and not capturable:
            raise RuntimeError(
                "Master weights is currently only supported with the capturable version."
            )
        lr = torch.tensor(lr, dtype=torch.float32) if capturable else lr
        defaults = dict(
            lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay
        )
        super().__init__(params, defaults)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.set_grad_none = set_grad_none
        self.capturable = capturable
        self.master_weights = master_weights
        device = self.param_groups[0]["params"][0].device
        if capturable:
            for group in self.param_groups:
                if group["params"]:
                    group["lr"] = group["lr"].to(device=group["params"][0].device)
            self._step_supports_amp_scaling = True
        # apex: torch.tensor([0], dtype=torch.int, device="cuda")
        self._dummy_overflow_buf = torch.tensor([0], dtype=torch.int, device=device)

    def zero_grad(self):
        if self.set_grad_none:
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad = None
        else:
            super().zero_grad()

    @torch.no_grad()
    def step(
        self,
        closure=None,
        grads=None,
        output_params=None,
        scale=None,
        grad_norms=None,
        grad_scaler=None,
    ):
        if any(p is not None for p in [grads, output_params, scale, grad_norms]):
            raise RuntimeError(
                "FusedAdam has been updated.  Simply initialize it identically to "
                "torch.optim.Adam, and call step() with no arguments."
            )
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if len(group["params"]) == 0:
                continue
            device = group["params"][0].device
            if "step" in group:
                group["step"] += (
                    1 if not self.capturable else (self._dummy_overflow_buf != 1).to(torch.int)
                )
            else:
                group["step"] = (
                    1 if not self.capturable else torch.tensor([1], dtype=torch.int, device=device)
                )
            inv_scale = None
            if self.capturable:
                found_inf = (
                    grad_scaler._check_inf_per_device(self)[device]
                    if grad_scaler is not None
                    else torch.zeros((1,), device=device)
                )
                self._dummy_overflow_buf.copy_(found_inf)
                if grad_scaler:
                    inv_scale = grad_scaler._get_scale_async().double().reciprocal().float()
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p.data).float()
                    state["exp_avg_sq"] = torch.zeros_like(p.data).float()
                self._update(p, state, group, inv_scale)
        return loss

    def _update(self, p, state, group, inv_scale) -> None:
        """apex's AdamFunctor / AdamCapturableFunctor on one tensor (no-op when capturable and
        the overflow buffer is set)."""
        beta1, beta2 = group["betas"]
        step = torch.as_tensor(group["step"], dtype=torch.float32, device=p.device)
        lr, decay, eps = group["lr"], group["weight_decay"], group["eps"]
        g = p.grad.float() * (inv_scale if inv_scale is not None else 1.0)
        w = p.data.float()
        if not self.adam_w_mode:
            g = g + decay * w
        m = beta1 * state["exp_avg"] + (1 - beta1) * g
        v = beta2 * state["exp_avg_sq"] + (1 - beta2) * g * g
        c1, c2 = (1 - beta1**step, 1 - beta2**step) if group["bias_correction"] else (1.0, 1.0)
        update = (m / c1) / ((v / c2).sqrt() + eps)
        if self.adam_w_mode:
            update = update + decay * w
        new = w - lr * update
        if self.capturable:  # the kernel returns at once when the overflow buffer is set
            skip = self._dummy_overflow_buf == 1
            m, v = torch.where(skip, state["exp_avg"], m), torch.where(skip, state["exp_avg_sq"], v)
            new = torch.where(skip, w, new)
        state["exp_avg"].copy_(m)
        state["exp_avg_sq"].copy_(v)
        p.data.copy_(new.to(p.dtype))
