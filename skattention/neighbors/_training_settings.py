"""The training settings of the learned metrics (the defaults behind ``"auto"``), and why:
figures in docs/performance.md."""

# n_components=None: keep the inputs' dimension up to this many components (PCA beyond it)
_DEFAULT_MAX_COMPONENTS = 128
# n_components=None with metric="tabular" (the benchmark's DEV sets: no loss against 128, and
# a fifth less training time)
_TABULAR_COMPONENTS = 64
# numeric_embedding="auto": periodic embeddings of the numbers from this many training samples
# (smaller DEV sets of the tabular benchmark were better without)
_PLR_MIN_SAMPLES = 1500
# batch_size="auto": minibatch size (fewer points when working_memory is smaller)
_AUTO_BATCH = 1024
# sample_rate="auto": besides the minibatch, this share of the other training points, at most
# _AUTO_CANDIDATES of them, are each minibatch's candidate keys
_AUTO_CANDIDATE_SHARE = 0.5
_AUTO_CANDIDATES = 1024
# the same two with metric="tabular": minibatches of 256 and at most 256 other candidates (on
# the tabular benchmark's DEV sets as good or better in every family, in half the fit time)
_TABULAR_BATCH = 256
_TABULAR_CANDIDATES = 256
# An epoch of training is at most this many training points (a fit's steps, and the spacing of
# its validations, do not grow with the number of rows)
_EPOCH_ROWS = 16384
# validation_fraction holds out at most this many rows (the rest train): the stopping rule and the
# temperature need a loss measured precisely enough, not one that costs more with more rows
MAX_VALIDATION_ROWS = 4096
# the validation pass of each epoch attends to at most this many training points
_VALIDATION_KEYS = 2048
# metric="tabular" with more than _EPOCH_ROWS training points (batch_size and sample_rate
# "auto"): minibatches of _SCALE_BATCH, each attending to a share _SCALE_CANDIDATE_SHARE of the
# other points (at most _SCALE_CANDIDATES), and validation over _SCALE_VALIDATION_KEYS of them.
# A few hundred candidates among 10^5 points rarely hold a query's near neighbours, so the
# metric learned is a coarse one, and a validation over 2,048 keys prefers it and stops early;
# prediction attends to every key, where a finer metric wins (docs/performance.md, "At scale").
_SCALE_BATCH = 1024
_SCALE_CANDIDATE_SHARE = 1 / 16
_SCALE_CANDIDATES = 8192
_SCALE_VALIDATION_KEYS = 8192
# ... and on tables of more than _EPOCH_ROWS rows, levels of a categorical column seen fewer than
# this many times share the "unseen" code: with many candidates a query meets the few rows of
# its own rare level (a tail number, an id), whose embedding then memorises their labels.
_SCALE_MIN_LEVEL_COUNT = 20
# ... and the categorical columns of at least this many levels add their levels' target
# statistics (cross-fitted; ``_target_statistics``) to the numbers, where they take at most
# _STATISTICS_MAX_TARGETS columns each (class indicators): the rare levels' code and the slowly
# learned embeddings of many levels told the map little about a title or a name
_STATISTICS_MIN_LEVELS = 30
_STATISTICS_MAX_TARGETS = 16
# ... and training also stops when the last n_iter_no_change epochs together improved the best
# validation loss by less than this share of it: on many rows the averaged loss keeps falling
# by hundredths of a percent an epoch after the test score has stopped (docs/performance.md)
_SCALE_WINDOW_GAIN = 2e-3
# ... or by less than this many standard errors of its per-row gains on the validation rows
# (paired): a gain within their noise (docs/performance.md)
_SCALE_WINDOW_Z = 2.0
# ... and where at most this share of the rows are distinct, equal rows are one key
_DISTINCT_SHARE = 0.9
# the temperature is calibrated on at most this many validation rows (a scalar needs fewer)
_CALIBRATION_ROWS = 2048
# Validation and the kept model use an exponential moving average of the parameters (this
# decay per step, less where an epoch has fewer than 10 steps: the average spans at most an
# epoch), whose validation loss is smooth enough to stop after n_iter_no_change=3 epochs
# without improvement (chosen on the tabular benchmark's DEV sets: docs/performance.md).
_AVERAGE_DECAY = 0.9
# Rows mapped at once by the learned map (fewer when working_memory is smaller): a row of the
# tabular map holds a few thousand numbers of activations, and larger chunks were slower too
# (their fresh pages), not only larger (docs/performance.md, "Peak memory at scale")
_EMBED_CHUNK = 8192
