"""Find every public estimator of the package, like :func:`sklearn.utils.all_estimators`."""

import importlib
import inspect
import pkgutil

from sklearn.base import BaseEstimator


def all_estimators(type_filter=None):
    """List the public estimators defined in skattention.

    Walks every public (non-underscore) subpackage and collects the public classes that derive
    from :class:`sklearn.base.BaseEstimator` and are not abstract.

    Parameters
    ----------
    type_filter : {"classifier", "regressor", "transformer", "cluster"} or list of those, \
            default=None
        Keep only estimators of these kinds.

    Returns
    -------
    estimators : list of (name, class)
        Sorted by name.

    Examples
    --------
    >>> from skattention.utils import all_estimators
    >>> [name for name, _ in all_estimators(type_filter="regressor")]
    ['MetricAttentionRegressor']
    """
    import skattention

    found = {}
    for module_info in pkgutil.walk_packages(skattention.__path__, prefix="skattention."):
        parts = module_info.name.split(".")
        if any(part.startswith("_") for part in parts[1:]) and not module_info.ispkg:
            # Private modules are reached through the public package that re-exports them.
            continue
        if any(part.startswith("_") for part in parts[1:]) or "tests" in parts:
            continue
        module = importlib.import_module(module_info.name)
        for name, obj in inspect.getmembers(module, inspect.isclass):
            if (
                not name.startswith("_")
                and issubclass(obj, BaseEstimator)
                and obj.__module__.startswith("skattention.")
                and not inspect.isabstract(obj)
            ):
                found[name] = obj
    for name, obj in inspect.getmembers(skattention, inspect.isclass):
        if issubclass(obj, BaseEstimator) and not name.startswith("_"):
            found[name] = obj
    estimators = sorted(found.items())
    if type_filter is None:
        return estimators
    kinds = [type_filter] if isinstance(type_filter, str) else list(type_filter)
    allowed = {"classifier", "regressor", "transformer", "cluster"}
    if not set(kinds) <= allowed:
        raise ValueError(f"type_filter must be None or in {sorted(allowed)}, got {type_filter!r}.")

    def kind_ok(cls):
        tags = cls().__sklearn_tags__()
        for kind in kinds:
            if kind == "transformer" and tags.transformer_tags is not None:
                return True
            if kind in ("classifier", "regressor", "cluster") and tags.estimator_type == (
                "clusterer" if kind == "cluster" else kind
            ):
                return True
        return False

    return [(name, cls) for name, cls in estimators if kind_ok(cls)]
