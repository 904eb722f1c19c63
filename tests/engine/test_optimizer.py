"""The training loop's Adam/AdamW: torch.optim's values to the bit, without importing it."""

import subprocess
import sys

import pytest
import torch

from skattention._engine._optimizers import Adam


def _params(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(5, 3, generator=g).requires_grad_(),
            torch.randn(3, generator=g).requires_grad_(),
            torch.randn((), generator=g).requires_grad_()]


def _run(optimizer, params, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = sum((p * torch.randn(p.shape, generator=g)).sum() ** 2 for p in params)
        loss.backward()
        optimizer.step()


@pytest.mark.parametrize("decoupled", [True, False])
def test_equals_torch_optim_to_the_bit_and_resumes_from_its_state(decoupled):
    ours, theirs = _params(0), _params(0)
    groups = lambda ps: [{"params": ps[:2], "weight_decay": 0.1},  # noqa: E731
                         {"params": ps[2:], "weight_decay": 0.0}]
    reference = (torch.optim.AdamW if decoupled else torch.optim.Adam)(groups(theirs), lr=0.01)
    optimizer = Adam(groups(ours), lr=0.01, decoupled=decoupled)
    _run(optimizer, ours, 7)
    _run(reference, theirs, 7)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # warm start from either's state: torch's layout both ways
    resumed, again = _params(2), _params(2)
    for p, q, r in zip(resumed, again, theirs, strict=True):
        p.data.copy_(r.data)
        q.data.copy_(r.data)
    from_torch = Adam(groups(resumed), lr=0.01, decoupled=decoupled)
    from_torch.load_state_dict(reference.state_dict())
    from_ours = Adam(groups(again), lr=0.01, decoupled=decoupled)
    from_ours.load_state_dict(optimizer.state_dict())
    _run(from_torch, resumed, 3, seed=5)
    _run(from_ours, again, 3, seed=5)
    _run(reference, theirs, 3, seed=5)
    for a, b, c in zip(resumed, again, theirs, strict=True):
        torch.testing.assert_close(a, c, rtol=0, atol=0)
        torch.testing.assert_close(b, c, rtol=0, atol=0)


def test_a_fit_does_not_import_torch_dynamo():
    code = (
        "import sys, numpy as np\n"
        "from skattention import MetricAttentionClassifier\n"
        "X = np.random.default_rng(0).normal(size=(60, 3)); y = (X[:, 0] > 0).astype(int)\n"
        "MetricAttentionClassifier(max_iter=2, random_state=0).fit(X, y)\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "False"
