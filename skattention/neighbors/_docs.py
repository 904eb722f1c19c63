"""Docstring fragments shared by the metric-attention estimators (one text per parameter)."""

METRIC = """metric : str, default="tabular"
        Pseudo-metric ``f``, learned end to end from the labels except for the fixed
        ``"euclidean"``, ``"manhattan"``, ``"minkowski"`` and ``"cosine"``:

        - ``"tabular"``: ``||phi(x) - phi(y)||`` (not squared; ModernNCA's metric) with ``phi``
          a linear layer over periodic embeddings of the numbers (``numeric_embedding``) and
          learned embeddings of the categories (see :doc:`/tabular`);
        - ``"mlp"``: ``||phi(x) - phi(y)||^2`` with ``phi`` a residual MLP (the seed paper's
          metric-attention);
        - ``"linear"``: ``||W x - W y||^2`` ("L2 self-attention");
        - ``"dot"``: ``-(W_Q x).(W_K y)``, standard asymmetric dot-product attention;
        - ``"euclidean"``: ``||x - y||^2`` on the raw inputs, nothing learned (k-NN, radius
          neighbours and Nadaraya-Watson are its exact special cases);
        - ``"manhattan"``: ``sum_j |x_j - y_j|`` on the raw inputs (a Laplace kernel);
          ``"minkowski"``: ``sum_j |x_j - y_j|^p`` (``p``; ``p=2`` is ``"euclidean"``, ``p=1``
          ``"manhattan"``); ``"cosine"``: ``1 - x.y / (||x|| ||y||)`` (a zero row is at
          distance 1 from every row). Nothing learned; with ``n_neighbors`` or ``radius`` and
          ``temperature=np.inf`` they are scikit-learn's neighbour estimators with the same
          ``metric`` (and ``p``); distances are ``f``, ``f**(1/p)`` for Minkowski's;
        - ``"precomputed"``: ``D_ij^2`` for a given distance matrix: ``fit`` takes the
          (n_samples, n_samples) distances between the training points, prediction the
          (n_queries, n_samples) distances from the queries to them (as scikit-learn's
          ``metric="precomputed"``); a numeric ``temperature`` is needed (not ``"auto"``).

        Learned metrics see the numeric columns robust-scaled (median and interquartile range,
        smoothly clipped); the fixed metrics see them as given, so that their distances are
        those of the input. Categorical columns enter ``"tabular"`` as codes of learned
        embeddings, the other metrics one-hot; missing numbers sit at the training median with
        a missing indicator (see :doc:`/tabular`).
    p : float >= 1, default=2
        Power of ``metric="minkowski"`` (ignored by the other metrics), as in scikit-learn's
        neighbour estimators."""

TEMPERATURE = """temperature : float >= 0 or "auto", default="auto"
        Softmax temperature ``T`` in units of ``f``. ``0`` is the arg-max (nearest neighbour)
        limit and ``np.inf`` the uniform limit; with a learned metric these limits apply at
        prediction, the metric being trained with a learned temperature (so ``n_neighbors=k,
        temperature=np.inf`` is k-NN in the learned metric). ``"auto"`` with a learned metric:
        ``"tabular"`` trains at ``T = 1`` (the map learns the scale), the others learn ``T``
        jointly (starting from the median squared distance between a training point and its
        nearest neighbour in the initial map); after training, with ``early_stopping``, ``T`` is
        re-fitted alone to minimise the loss of the validation points attending to the training
        points (a grid of ``log T`` over +-2.5 around the trained value in steps of 0.5, then
        grids of step 0.1 and 0.02 around the best point). With a fixed metric: the
        value among 8 from 1/8 to 16 times the median ``f`` between a training point and its
        nearest distinct one (the squared distance for ``"euclidean"``) with the lowest
        leave-one-out loss (on at most 2000 training points). The value used is
        ``temperature_``."""

NEIGHBORS = """n_neighbors : int, default=None
        k-NN prior at prediction: each query attends only to its ``n_neighbors`` nearest training
        points (in the metric). ``None`` attends to all of them. Training always attends to
        sampled candidates without it.
    radius : float, default=None
        Radius prior at prediction: each query attends only to training points within
        distance ``radius`` (``f(x, x_j) <= radius**2`` for the Euclidean metrics; a point
        exactly at distance ``radius`` included; 0: the points at distance 0 from the query,
        ``inf``: every point). A query with none gets the classifier's
        ``outlier_label``, or NaN with a warning from the regressor, as in scikit-learn's
        radius-neighbour estimators.
    weights : {"uniform", "distance"} or callable, default="uniform"
        Weight of each selected neighbour, as in scikit-learn's neighbour estimators:
        ``"distance"`` multiplies a neighbour's attention weight by the inverse of its distance
        (neighbours at distance 0, if any, take all the weight), a callable maps an array of
        distances to weights of the same shape. Needs a selection (``n_neighbors``, ``radius``
        or ``temperature=0``) and equal prior weights of the training points (no
        ``sample_weight`` or ``class_weight``); with ``temperature=np.inf`` it equals
        :class:`~sklearn.neighbors.KNeighborsClassifier` (``weights="distance"``) and the other
        neighbour estimators.
    prototypes : "auto", int or None, default="auto"
        Dense attention (no ``n_neighbors``, no ``radius``, ``0 < temperature < inf``) with a
        learned metric over many training points: the keys are grouped around prototypes, and
        a query attends exactly to every key of its 16 nearest groups and to each other group
        through its prototype, in one softmax. A group is the keys nearest to one of randomly
        drawn keys; its prototype is their mean, carrying their summed prior weight (as a
        log-prior) and their mean values. A prediction then costs a pass over the prototypes
        and the near groups' keys, not over every training point (see :doc:`/neighbors`, "Many
        training points"). ``"auto"``: from 16,384 training points, twice the square root of
        their number of prototypes (256 to 4,096) if the outputs on held-out points differ
        from exact attention over every key by at most 0.01 on average (the probability mass
        moved, or standardised targets; measured again at the calibrated temperature), else
        every key. An int: that many prototypes, when fewer than the training points the
        fit trains on (those left by ``validation_fraction``; else every key, with a warning).
        ``None``: every key, always. Selections (``kneighbors``, ``n_neighbors``, ``radius``)
        always use every key. The measured difference is ``prototype_error_``."""

LEARNING = """n_components : int, default=None
        Dimension of the learned space. ``None``: 64 for ``"tabular"``; otherwise the number of
        features, at most 128 (then initialised by PCA). At most the number of features (after
        encoding) for ``"linear"``, as in NCA.
    numeric_embedding : {"auto", "plr", "none"}, default="auto"
        How ``metric="tabular"`` embeds each number (and missing indicator): ``"plr"``, a
        periodic embedding (24 learned frequencies, cosines and sines through a linear layer
        to 12 values shared by all numbers, and a ReLU); ``"none"``, the number as it is;
        ``"auto"``: ``"plr"`` from 1,500 training samples, ``"none"`` below (on the tabular
        benchmark's development sets, small data did better without). Not used by the other
        metrics.
    hidden_size : int, default=256
        Width of the hidden layer of each residual block (``metric="mlp"``).
    n_blocks : int, default=1
        Number of residual blocks (``metric="mlp"``); 0 gives a linear map.
    activation : {"relu", "tanh", "gelu"}, default="relu"
        Activation of the residual blocks (the seed paper uses ``"tanh"``).
    dropout : float in [0, 1), default=0.0
        Dropout inside the residual blocks during training.
    max_iter : int, default=100
        Maximum number of epochs. An epoch is every training point, or 16,384 of them where
        there are more (the next ones of a random order of all of them that continues from
        epoch to epoch): validation, early stopping and progress come every 16,384 points, and
        the steps of a fit do not grow with the number of rows.
    batch_size : int or "auto", default="auto"
        Training points per minibatch. ``"auto"``: 256 with ``metric="tabular"`` (1,024 from
        16,384 training points), else 1,024 (all of them when fewer; fewer when a step would
        not fit ``working_memory``).
    learning_rate : float, default=1e-2
        AdamW learning rate.
    weight_decay : float, default=2e-4
        AdamW weight decay of the map (not of the temperature).
    sample_rate : float in (0, 1] or "auto", default="auto"
        Fraction of the training points used as candidate keys for each minibatch: the batch
        itself plus a random sample of the others (each point excluded from its own
        candidates). ``"auto"``: the batch and half of the other points, at most 256 of them
        with ``metric="tabular"``, else 1,024 (ModernNCA's sampling); with
        ``metric="tabular"`` and more than 16,384 training points, at most a sixteenth of
        them, up to 8,192 (a sample of a few hundred rarely holds a point's near neighbours
        among many rows).
    early_stopping : bool, default=True
        Hold out ``validation_fraction`` of the training data (stratified for classes) and stop
        when the loss on it has not improved by ``tol`` for ``n_iter_no_change`` epochs,
        restoring the best epoch; each epoch's validation points attend to a fixed sample of at
        most 2,048 training points (with ``metric="tabular"`` and more than 16,384 training
        points, 8,192 of them). What is validated, and kept, is an
        exponential moving average of the parameters over the training steps (decay 0.9 per
        step, at most ``1 - 1 / steps_per_epoch``: it spans at most an epoch), whose
        validation loss varies less from epoch to epoch than the parameters' own. With
        ``metric="tabular"`` and more than 16,384 training points, training also stops when
        the last ``n_iter_no_change`` epochs together improved the best validation loss by
        less than 0.2% of it, or by less than twice the standard error of that gain over the
        validation rows (paired: a gain within their noise). Without
        early stopping, the same rule applies to the training loss (and the parameters
        themselves). The validation points (at most 2,048 of them) also calibrate
        ``temperature="auto"`` after training. Prediction attends to all
        the points given to ``fit``, the validation points included.
    validation_fraction : float in (0, 1), default=0.15
        Held-out fraction for early stopping, at most 4,096 points (the others train).
    n_iter_no_change : int, default=3
        Epochs without improvement before stopping.
    tol : float, default=1e-4
        Minimum improvement of the validation loss (or training loss) that resets
        ``n_iter_no_change``.
    warm_start : bool, default=False
        Continue training the fitted map and temperature on the next ``fit`` instead of
        starting again. The first fit's encoding of the columns is kept: levels it did not
        see read as one "unseen" level (a warning where they are most of a column's values).
    random_state : int, RandomState instance or None, default=None
        Seeds initialisation, the validation split, minibatches, candidate sampling and dropout.
        An int gives bit-identical models on the CPU at a given torch thread count.
    verbose : int, default=0
        ``0``: silent. ``1``: a progress bar on standard error over the training epochs (loss
        and validation score) and over long predictions (tqdm when installed, else plain lines;
        ``pip install skattention[progress]``). ``2``: also one line per epoch."""

DEVICE = """device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
        Where training and attention run. ``"auto"``: CUDA when available, else the CPU. The
        fitted model holds NumPy arrays and a CPU torch module, so it pickles and loads anywhere.
    dtype : {"float32", "float64"}, NumPy or torch dtype, default=None
        Compute precision: ``"float32"``, ``"float64"`` or a NumPy or torch dtype of either
        (``np.float64``, ``np.dtype("float64")``, ``torch.float64``), kept as given by
        ``get_params``; other dtypes (``np.float16``, integers) are rejected. ``None``: learned
        metrics train and predict (the map and the attention) in float32, the precision of their
        map; fixed metrics predict in float32 when the training data is float32, else in
        float64. Either way the selections (the k nearest, the radius, ``temperature=0``) are
        decided on exact distances, and a query's output does not depend on how the queries
        are batched (a row predicted alone equals the same row in a batch, to the last bit),
        except that with ``prototypes`` in use calls of at most 4 rows take a faster lane that
        rounds otherwise (about 1e-7 in float32). ``"float32"`` predicts about 3x faster
        than ``"float64"`` on the CPU (dense attention over 100,000 keys: 1.9 s against 5.7 s).
    n_jobs : int, default=None
        Threads of the engine's CPU kernels (torch's OpenMP pool, and MKL's for its matrix
        products) during ``fit``, prediction and the neighbour queries, set for the calling
        thread (OpenMP's through ``threadpoolctl``) and restored after the call. ``None``:
        the current setting (every core, unless limited by ``OMP_NUM_THREADS``,
        ``threadpoolctl`` or a joblib worker's share); ``-1``: every thread that setting
        allows; ``-2``: all but one, and so on, as scikit-learn's OpenMP loops count; more
        than the CPUs: the CPUs. Results do not depend on it beyond float rounding in sums
        (learned maps are bit-identical at a given thread count). Not used on a GPU."""

LEARNED_ATTRIBUTES = """map_ : torch.nn.Module or None
        The learned map (on the CPU, in its training precision: float32, float64 with
        ``dtype="float64"``; ``map_.query`` / ``map_.key`` map the encoded inputs).
        ``None`` for ``metric="euclidean"``.
    loss_curve_ : list of float
        Mean training loss per epoch (learned metrics).
    validation_scores_ : list of float or None
        Validation score per epoch with ``early_stopping``: accuracy of single-output class
        labels, else the R^2 of the values the attention propagates (a multi-output
        classifier's one-hot labels; the regressor's standardised targets less ``trend_``
        where it has one, so not the R^2 of ``y`` that ``score`` gives).
    validation_loss_curve_ : list of float or None
        Validation loss per epoch with ``early_stopping`` (the stopping criterion).
    best_validation_score_ : float or None
        Validation score of the restored (lowest validation loss) epoch.
    n_iter_ : int
        Epochs run (0 for ``metric="euclidean"``)."""

PROTOTYPE_ATTRIBUTES = """n_prototypes_ : int or None
        Number of prototypes of the keys dense attention predicts over (see ``prototypes``);
        ``None``: every training point.
    prototype_error_ : float or None
        Mean difference between attention over the prototypes and over every key on held-out
        points, measured at fit (``None`` without prototypes)."""

CATEGORICAL = """categorical_features : "from_dtype", array-like of bool, int or str, or None, \
            default="from_dtype"
        Which columns of ``X`` are categorical, as in
        :class:`~sklearn.ensemble.HistGradientBoostingClassifier`. ``"from_dtype"``: the pandas
        ``category``, string and object columns of a DataFrame (booleans count as numbers 0/1;
        an object column of numbers alone is numeric; datetimes and durations, whatever their
        dtype, are numbers of seconds, since the Unix epoch for datetimes);
        a boolean mask, column indices or (for a DataFrame) column names select them
        explicitly; ``None``: every column is numeric. Categorical columns enter one-hot (one
        column per training level, plus one for "missing" where the column had missing values
        at fit); a level unseen at fit time is all zeros. With ``metric="tabular"`` they enter
        as codes of learned embeddings instead, and on a table of more than 16,384 rows the
        levels seen fewer than 20 times share the code of unseen levels, while each column of
        at least 30 levels adds its levels' target statistics (the mean target, or the class
        frequencies, shrunk as :class:`~sklearn.preprocessing.TargetEncoder` does; a training
        row's from the other folds of a 5-fold split) as numbers where they predict the
        target better than its mean (no column has them where they would take more than 16
        columns each: 17 classes or more, or outputs whose classes or targets add up to more).
        Sparse matrices are numeric only."""

INPUT_ATTRIBUTES = """n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Names of features seen during fit, when ``X`` has string column names."""

FIT_ATTRIBUTES = f"""temperature_ : float
        The temperature used.
    {LEARNED_ATTRIBUTES}
    n_samples_fit_ : int
        Number of training samples.
    {INPUT_ATTRIBUTES}"""


def fill(doc):
    """Substitute the shared fragments into an estimator docstring."""
    for name, text in [
        ("METRIC", METRIC), ("TEMPERATURE", TEMPERATURE), ("NEIGHBORS", NEIGHBORS),
        ("LEARNING", LEARNING), ("DEVICE", DEVICE), ("FIT_ATTRIBUTES", FIT_ATTRIBUTES),
        ("INPUT_ATTRIBUTES", INPUT_ATTRIBUTES), ("CATEGORICAL", CATEGORICAL),
        ("PROTOTYPE_ATTRIBUTES", PROTOTYPE_ATTRIBUTES),
    ]:
        doc = doc.replace("{" + name + "}", text)
    return doc
