"""The optimizers of the training loop (torch only): Adam/AdamW, and an exponential moving
average of the parameters over its steps."""

import torch


class Adam:
    """Adam, or AdamW (``decoupled``: weight decay as ``param *= 1 - lr * weight_decay``
    instead of an L2 term in the gradient), computed as ``torch.optim``'s single-tensor code
    computes it (the optimizer torch uses for CPU parameters: the same values to the bit), with
    its ``state_dict`` layout. Not ``torch.optim`` itself: its ``Optimizer`` imports
    ``torch._dynamo`` on first use, a slow import added to the first fit of every process
    (docs/performance.md, "Fit").

    ``groups``: parameters, or dicts of ``params`` and ``weight_decay``, as for ``torch.optim``.
    """

    def __init__(self, groups, lr, weight_decay=0.0, decoupled=True, betas=(0.9, 0.999),
                 eps=1e-8):
        groups = list(groups)
        if not groups or not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.decoupled = decoupled
        self.param_groups = [
            {"params": list(g["params"]), "lr": lr, "betas": betas, "eps": eps,
             "weight_decay": g.get("weight_decay", weight_decay)}
            for g in groups
        ]
        self.state = {}
        # a buffer per parameter for the step's denominator (not state: never saved), so that
        # no step allocates (and first-touches) a parameter-sized tensor
        self._denominators = {}

    def _params(self):
        return [p for group in self.param_groups for p in group["params"]]

    def zero_grad(self, set_to_none=True):
        for p in self._params():
            p.grad = None

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
            weight_decay = group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                state = self.state.get(param)
                if state is None:
                    state = self.state[param] = {
                        "step": torch.tensor(0.0, dtype=torch.float32),
                        "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                        "exp_avg_sq": torch.zeros_like(
                            param, memory_format=torch.preserve_format
                        ),
                    }
                state["step"] += 1
                if weight_decay != 0:
                    if self.decoupled:
                        param.mul_(1 - lr * weight_decay)
                    else:
                        grad = grad.add(param, alpha=weight_decay)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step = state["step"].item()
                bias_correction1 = 1 - beta1**step
                bias_correction2 = 1 - beta2**step
                step_size = lr / bias_correction1
                denom = self._denominators.get(param)
                if denom is None:
                    denom = self._denominators[param] = torch.empty_like(exp_avg_sq)
                torch.sqrt(exp_avg_sq, out=denom).div_(bias_correction2**0.5).add_(eps)
                param.addcdiv_(exp_avg, denom, value=-step_size)

    def state_dict(self):
        """``torch.optim``'s layout: per-parameter state by position, and the groups."""
        index = {id(p): i for i, p in enumerate(self._params())}
        groups = []
        for group in self.param_groups:
            entry = {k: v for k, v in group.items() if k != "params"}
            entry.update(amsgrad=False, maximize=False,
                         decoupled_weight_decay=self.decoupled,
                         params=[index[id(p)] for p in group["params"]])
            groups.append(entry)
        state = {index[id(p)]: dict(s) for p, s in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """The state of a :meth:`state_dict` (or of ``torch.optim.Adam``/``AdamW``'s), moved to
        each parameter's device and dtype (``step`` stays a CPU float tensor)."""
        params = self._params()
        self.state = {}
        for i, saved in state_dict["state"].items():
            param = params[int(i)]
            self.state[param] = {
                "step": torch.as_tensor(saved["step"], dtype=torch.float32).clone().cpu(),
                "exp_avg": saved["exp_avg"].to(device=param.device, dtype=param.dtype,
                                               copy=True),
                "exp_avg_sq": saved["exp_avg_sq"].to(device=param.device, dtype=param.dtype,
                                                     copy=True),
            }
        for group, saved in zip(self.param_groups, state_dict["param_groups"], strict=False):
            group.update({k: saved[k] for k in ("lr", "betas", "eps", "weight_decay")
                          if k in saved})


class AveragingOptimizer:
    """An optimizer whose steps also update an exponential moving average of the parameters
    (``average``: the decay per step); :meth:`swap_in` puts the averages in the parameters'
    place (the live values kept), :meth:`swap_out` the live values back."""

    def __init__(self, optimizer, params, average):
        self.optimizer, self.params, self.average = optimizer, params, average
        self.averages = [p.detach().clone() for p in params]
        self.live = None

    def step(self):
        self.optimizer.step()
        with torch.no_grad():
            for a, p in zip(self.averages, self.params, strict=True):
                a.lerp_(p, 1.0 - self.average)

    def swap_in(self):
        with torch.no_grad():
            self.live = [p.detach().clone() for p in self.params]
            for a, p in zip(self.averages, self.params, strict=True):
                p.copy_(a)

    def keep_average(self):
        """The averages in the parameters' place for good (the live values dropped)."""
        self.swap_in()
        self.live = None

    def swap_out(self):
        if self.live is None:
            return
        with torch.no_grad():
            for v, p in zip(self.live, self.params, strict=True):
                p.copy_(v)
        self.live = None
