"""Convergence of the attention generator to the drift-diffusion operator on the circle.

Samples of the density ``p ~ 1 + 0.5 cos(theta)`` on the unit circle, ``f = sin(theta)``.
``attention_generator`` at ``epsilon = 2 eps`` (its temperature) returns
``(S_eps f - f) / (eps / 2)``; the limit is
``Lap f + 2 (1 - alpha) <grad log p, grad f>``. Left: RMS error against ``eps`` for growing ``n``
(bias falls with ``eps``, sampling noise grows as ``eps`` shrinks, so the best ``eps`` shrinks as
``n`` grows). Right: the estimate at the largest ``n`` against the exact limit.
Runs at documentation build time (a few seconds on one CPU thread).
"""

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np

from skattention.manifold import attention_generator


def circle_sample(n, rng):
    """Angles with density proportional to 1 + 0.5 cos(theta), by rejection sampling."""
    theta = np.empty(0)
    while len(theta) < n:
        t = rng.uniform(0, 2 * np.pi, 4 * n)
        theta = np.r_[theta, t[rng.uniform(0, 1.5, 4 * n) < 1 + 0.5 * np.cos(t)]]
    return np.sort(theta[:n])


def limit(theta, alpha):
    """Lap f + 2 (1 - alpha) <grad log p, grad f> for f = sin(theta)."""
    drift = (-0.5 * np.sin(theta) / (1 + 0.5 * np.cos(theta))) * np.cos(theta)
    return -np.sin(theta) + 2 * (1 - alpha) * drift


sizes = [500, 2000, 6000]
epsilons = np.geomspace(0.015, 0.5, 7)
fig, (ax_err, ax_fun) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
for alpha, style in [(0.0, "-"), (1.0, "--")]:
    for n, colour in zip(sizes, ["C0", "C1", "C2"]):
        theta = circle_sample(n, np.random.default_rng(0))
        X = np.c_[np.cos(theta), np.sin(theta)]
        exact = limit(theta, alpha)
        estimates = [
            attention_generator(X, np.sin(theta), epsilon=2 * eps, alpha=alpha, device="cpu")
            for eps in epsilons
        ]
        errors = [np.sqrt(np.mean((estimate - exact) ** 2)) for estimate in estimates]
        ax_err.loglog(
            epsilons,
            errors,
            style,
            marker="o",
            ms=3,
            color=colour,
            label=f"n = {n}, alpha = {alpha:g}",
        )
    best = int(np.argmin(errors))  # at the largest n
    estimate, best = estimates[best], epsilons[best]
    ax_fun.plot(theta, estimate, ".", ms=1.5, alpha=0.5, color="C0" if alpha == 0 else "C3",
                label=f"attention, alpha = {alpha:g}, eps = {best:.2g}")
    ax_fun.plot(theta, exact, "k" + style, lw=1.2, label=f"limit, alpha = {alpha:g}")
ax_err.set(xlabel="eps (attention temperature 2 eps)", ylabel="RMS error against the limit",
           title="Generator error on the circle, density 1 + 0.5 cos")
ax_err.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # minor labels overlap
ax_err.legend(fontsize=7, ncol=2)
ax_fun.set(xlabel="theta", ylabel="(S f - f) / (eps / 2)", title=f"f = sin(theta), n = {sizes[-1]}")
ax_fun.legend(fontsize=7, markerscale=6)
