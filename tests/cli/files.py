"""Files of the command line's tests."""


def write(path, text, encoding="utf-8"):
    """``text`` written to ``path`` in ``encoding``; returns ``path``."""
    path.write_bytes(text.encode(encoding))
    return path


def blobs_csv(tmp_path, with_target=True):
    """``(path, X, y)``: three blobs of 120 rows as a CSV file (with a text target)."""
    from sklearn.datasets import make_blobs

    X, y = make_blobs(120, centers=[[0, 0, 0], [8, 0, 0], [0, 8, 0]], random_state=0)
    path = tmp_path / "blobs.csv"
    header = "a,b,c" + (",kind" if with_target else "")
    rows = [
        ",".join(f"{v:.6f}" for v in x) + (f",k{t}" if with_target else "") for x, t in zip(X, y)
    ]
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path, X, y
