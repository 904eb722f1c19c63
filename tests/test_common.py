"""scikit-learn's estimator checks on every public estimator, found automatically."""

import numpy as np
from sklearn.utils.estimator_checks import parametrize_with_checks

from skattention.cluster import AttentionKMeans, AttentionMeanShift
from skattention.manifold import AttentionDiffusionEmbedding
from skattention.neighbors import MetricAttentionClassifier
from skattention.neighbors._strategy import FIXED_METRICS
from skattention.nn import AttentionNetworkClassifier
from skattention.utils import all_estimators
from tests.conftest import cheap

# Cheap settings (tests/conftest.py) where the defaults make ~55 checks slow, not different.
SLOW_DEFAULTS = {"AttentionNetworkClassifier"}
DEFAULTS = [cheap(name) if name in SLOW_DEFAULTS else cls() for name, cls in all_estimators()]
# Other code paths of the same estimators: the fixed metric of the attention estimators (no
# training), hard and fixed-temperature k-means, flat-kernel and blurring mean shift, and the
# sparse k-NN diffusion operator.
FIXED_METRIC = [
    cls(metric="euclidean") for _, cls in all_estimators()
    if cls().get_params().get("metric", "euclidean") != "euclidean"
    and "euclidean" in cls._parameter_constraints["metric"][0].options
]
OTHER_PATHS = [
    AttentionKMeans(temperature=0),
    AttentionKMeans(temperature=1.0),
    AttentionMeanShift(kernel="flat"),
    AttentionMeanShift(blurring=True),
    AttentionDiffusionEmbedding(n_neighbors=5),
]
# Documented settings a user tries, with cheap training: the other fixed metrics and given
# distances, selections, scikit-learn's k-NN, weighting, precision, no early stopping, a warm
# start and columns named categorical.
NON_DEFAULT = [
    cheap(name, **params)
    for name in ("MetricAttentionClassifier", "MetricAttentionRegressor")
    for params in (
        dict(metric="manhattan"), dict(metric="cosine"), dict(metric="minkowski", p=3),
        dict(metric="precomputed", temperature=1.0), dict(n_neighbors=3),
        dict(metric="euclidean", n_neighbors=3, temperature=np.inf),
        dict(dtype="float64", early_stopping=False), dict(warm_start=True),
    )
] + [
    cheap("MetricAttentionClassifier", class_weight="balanced", categorical_features=[0]),
    cheap("MetricAttentionTransformer", metric="mlp", n_components=2, warm_start=True),
]

_STOCHASTIC_TRAINING = (
    "the learned metric is trained by minibatch AdamW with sampled candidates: an integer sample "
    "weight scales a point's loss and prior exactly, but cannot reproduce the different random "
    "batches and candidate samples that repeating the point produces (as for scikit-learn's SGD "
    "estimators). The fixed metric passes this check."
)
_NOTHING_TRAINED = (
    "with a fixed metric (or given distances) nothing is trained, so n_iter_ is 0 by design; "
    "max_iter and the other training parameters belong to the learned metrics of the same "
    "estimator."
)
_INIT_DEPENDS_ON_ROWS = (
    "as for scikit-learn's KMeans (same expected failure there): without annealing the result "
    "depends on the k-means++ initialisation, whose random draws pick different rows when a "
    "point is repeated than when it is weighted. With temperature='auto' (deterministic "
    "annealing from the weighted mean) the check passes."
)


_ROUNDED_FOR_CATEGORIES = (
    "the check rounds X to non-negative integers for an estimator with the categorical input "
    "tag (24 distinct points of 2 features in the three-class problem), whose angles are all "
    "the cosine distance sees: there scikit-learn's KNeighborsClassifier(metric='cosine') "
    "scores 0.82 and this classifier 0.81, under the check's 0.83. On the check's unrounded "
    "blobs this classifier scores 0.995 (two classes) and 0.973 (three)."
)
_WARM_START_CONTINUES = (
    "warm_start=True continues training the previous fit's map on the next fit (as "
    "scikit-learn's MLP with warm_start), so consecutive fits on the same data differ; the "
    "other checks pass with it."
)
_WARM_START_REFITS = {
    "MetricAttentionRegressor": ["check_supervised_y_2d"],
    "MetricAttentionTransformer": ["check_pipeline_consistency", "check_transformer_general",
                                   "check_transformer_data_not_an_array"],
}

_PREDICT_PROBA_OF_A_CLUSTERER = (
    "scikit-learn's sparse-input check reads the classifier tags of any estimator with "
    "predict_proba (None for a clusterer: AttributeError). fit, predict and predict_proba on "
    "every sparse format, with 32- and 64-bit indices, are tested in tests/cluster/test_kmeans.py."
)


def expected_failed_checks(estimator):
    """Every expected failure with its written reason."""
    if isinstance(estimator, AttentionKMeans):
        failures = {f"check_estimator_sparse_{kind}": _PREDICT_PROBA_OF_A_CLUSTERER
                    for kind in ("array", "matrix")}
        if estimator.temperature != "auto":
            failures.update({f"check_sample_weight_equivalence_on_{kind}_data":
                             _INIT_DEPENDS_ON_ROWS for kind in ("dense", "sparse")})
        return failures
    if isinstance(
        estimator, (AttentionMeanShift, AttentionDiffusionEmbedding, AttentionNetworkClassifier)
    ):
        return {}
    if estimator.metric in FIXED_METRICS + ("precomputed",):
        failures = {"check_non_transformer_estimators_n_iter": _NOTHING_TRAINED}
        if estimator.metric == "cosine" and isinstance(estimator, MetricAttentionClassifier):
            failures["check_classifiers_train"] = _ROUNDED_FOR_CATEGORIES
        return failures
    # sparse input is accepted (densified in row blocks), so the sparse variant runs too
    failures = {f"check_sample_weight_equivalence_on_{kind}_data": _STOCHASTIC_TRAINING
                for kind in ("dense", "sparse")}
    if estimator.warm_start:
        failures.update(dict.fromkeys(_WARM_START_REFITS.get(type(estimator).__name__, ()),
                                      _WARM_START_CONTINUES))
    return failures


def test_discovery_finds_the_estimators():
    names = {name for name, _ in all_estimators()}
    assert {
        "MetricAttentionClassifier",
        "MetricAttentionRegressor",
        "MetricAttentionTransformer",
        "AttentionDiffusionEmbedding",
        "AttentionKMeans",
        "AttentionMeanShift",
        "AttentionNetworkClassifier",
    } <= names
    assert len(FIXED_METRIC) == 2


@parametrize_with_checks(
    DEFAULTS + FIXED_METRIC + OTHER_PATHS + NON_DEFAULT,
    expected_failed_checks=expected_failed_checks,
)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)
