"""Conformance with scikit-learn's (and pyDiffMap's) own test cases, on the configurations the
docs call exact, with the ties, duplicates, boundaries, dtypes, block sizes and batchings of real
data. A case that fails for a known, filed reason is ``xfail(strict=True)`` with that reason:
once fixed it fails as XPASS, and its marker is removed (issue 14's are all fixed).

"Exact" at ties: the k nearest are chosen in (exact distance, index) order, the lower training
index first; where scikit-learn's neighbour heap keeps another of the points tied at the k-th
distance, the k-NN references (``_cases._ByIndex``) use that rule with scikit-learn's own voting
and averaging, and are checked equal to scikit-learn everywhere else."""
