"""torch.optim.AdamW's update as a pure function over parameter pytrees,
computed with torch ops through torchax."""
import numpy as np
import torch

from ._functional import jax_function


class AdamW:
    """The update torch.optim.AdamW(lr, betas, eps, weight_decay) makes
    (its default single-tensor path: amsgrad, maximize, capturable off),
    over dicts of arrays, for plexus.jit programs.

    update(params, grads, state) -> (params, state) is a JAX function; the
    state is {"step", "exp_avg", "exp_avg_sq"} as torch keeps it (step a
    float32 scalar). It computes torch's formulas with torch ops; the one
    difference is that torch takes the bias corrections (1 - beta ** step)
    in float64 on the host, and this in float32 on the device."""

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=1e-2):
        self.lr, self.betas = float(lr), tuple(float(b) for b in betas)
        self.eps, self.weight_decay = float(eps), float(weight_decay)
        self._update = jax_function(self._torch_update)
        self._update.__name__ = "AdamW.update"

    def init(self, params):
        """The state before the first step: zero moments, step 0 (numpy)."""
        zeros = {k: np.zeros_like(np.asarray(v)) for k, v in params.items()}
        return {"step": np.zeros((), np.float32), "exp_avg": zeros,
                "exp_avg_sq": {k: v.copy() for k, v in zeros.items()}}

    def update(self, params, grads, state):
        return self._update(params, grads, state)

    def _torch_update(self, params, grads, state):
        lr, (beta1, beta2), eps = self.lr, self.betas, self.eps
        step = state["step"] + 1
        bias1 = 1 - torch.pow(torch.tensor(beta1), step)
        bias2_sqrt = torch.sqrt(1 - torch.pow(torch.tensor(beta2), step))
        step_size = lr / bias1
        new_p, new_m, new_v = {}, {}, {}
        for k, p in params.items():
            g = grads[k]
            p = p * (1 - lr * self.weight_decay)
            m = state["exp_avg"][k].lerp(g, 1 - beta1)
            v = state["exp_avg_sq"][k] * beta2 + (1 - beta2) * (g * g)
            denom = v.sqrt() / bias2_sqrt + eps
            new_p[k] = p - step_size * (m / denom)
            new_m[k], new_v[k] = m, v
        return new_p, {"step": step, "exp_avg": new_m, "exp_avg_sq": new_v}
