"""The k-NN diffusion operators the eigen-solver tests decompose."""

from sklearn.datasets import make_swiss_roll
from sklearn.utils import check_random_state

from skattention.manifold._operator import auto_epsilon, diffusion_operator, knn_graph


def knn_operator(X, k=15):
    knn = knn_graph(X, k, "cpu")
    epsilon, _ = auto_epsilon(X, knn[0], check_random_state(0), "cpu")
    return diffusion_operator(X, epsilon, 1.0, knn, "cpu")


def swiss_roll(n):
    return make_swiss_roll(n, noise=0.05, random_state=0)[0]
