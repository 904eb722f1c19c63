"""Conformance with scikit-learn's (and pyDiffMap's) own test cases, on the configurations the
docs call exact, with the ties, duplicates, boundaries, dtypes, block sizes and batchings of real
data. A case that fails today for a reason issue 14 lists is ``xfail(strict=True)`` with that
reason: once fixed it fails as XPASS, and its marker is removed."""
