"""A matrix's rows as dense blocks: a dense tensor's rows as they are, a CSR matrix's densified
one block at a time (torch only).

The k-means loops read their points through :class:`RowBlocks`, so that a sparse matrix (text,
one-hot data) is never held densely beyond the block that a loop's planner sized from
``working_memory``. A ``shift`` is subtracted from each block (centring without a centred copy
of the matrix) and the block is then cast to ``dtype``: bit for bit the values of the centred
dense matrix cast to ``dtype``. A CSR matrix is held as its three arrays (torch's sparse CSR
tensors warn that they are a beta feature, and only row slices are needed here).
"""

import torch

from ._budget import budget_bytes, plan_rows


class RowBlocks:
    """The rows of a dense tensor or of a CSR matrix, minus ``shift``, in ``dtype``.

    Parameters
    ----------
    matrix : Tensor of shape (n, d), or None
        The dense matrix; ``None`` for a CSR matrix (see :meth:`from_csr`).
    shift : Tensor of shape (d,), default=None
        Subtracted from every row read, in the matrix's dtype.
    dtype : torch.dtype, default=None
        The dtype of the rows read (after the shift); ``None``: the matrix's.
    csr : tuple, default=None
        ``(indptr, indices, values, n_columns)`` of a CSR matrix: int64 tensors of row
        pointers and column indices, the stored values (the other entries are zeros; repeated
        entries of a row are added, as SciPy's ``toarray`` adds them).
    """

    def __init__(self, matrix, shift=None, dtype=None, csr=None):
        self.matrix, self.csr, self.shift = matrix, csr, shift
        self.sparse = csr is not None
        if self.sparse:
            indptr, _, values, n_columns = csr
            self.source_dtype, self.device = values.dtype, values.device
            self.shape = (indptr.numel() - 1, n_columns)
        else:
            self.source_dtype, self.device = matrix.dtype, matrix.device
            self.shape = tuple(matrix.shape)
        self.dtype = self.source_dtype if dtype is None else dtype
        # a block read is a new tensor (scratch memory per row), not a view of the matrix
        self.copies = self.sparse or shift is not None or self.dtype != self.source_dtype

    @classmethod
    def from_csr(cls, indptr, indices, values, n_columns, shift=None):
        """A CSR matrix's rows (the arrays on one device; indices converted to int64)."""
        return cls(None, shift, csr=(indptr.long(), indices.long(), values, int(n_columns)))

    def element_size(self):
        """Bytes per value of the rows read."""
        return torch.finfo(self.dtype).bits // 8

    def copy_bytes(self):
        """Scratch bytes per row read: the densified or shifted row, and its cast."""
        read = self.sparse or self.shift is not None
        source = torch.finfo(self.source_dtype).bits // 8 if read else 0
        cast = self.element_size() if self.dtype != self.source_dtype else 0
        return self.shape[1] * (source + cast)

    def block(self, start, stop):
        """Rows ``start:stop`` as a dense tensor (a view of a dense matrix when nothing changes
        them)."""
        if self.sparse:
            x = self._densified(start, stop)
            if self.shift is not None:
                x = x.sub_(self.shift)
        else:
            x = self.matrix[start:stop]
            if self.shift is not None:
                x = x - self.shift
        return x.to(self.dtype)

    def dense(self):
        """All rows as one dense tensor (the matrix itself when nothing changes them)."""
        return self.block(0, self.shape[0])

    def astype(self, dtype):
        """The same rows read in ``dtype``."""
        return RowBlocks(self.matrix, self.shift, dtype, self.csr)

    def shifted(self, shift):
        """The same rows minus ``shift`` (``None``: unchanged)."""
        if shift is None:
            return self
        if self.shift is not None:
            raise ValueError("These rows are shifted already.")
        return RowBlocks(self.matrix, shift, self.dtype, self.csr)

    def take(self, index):
        """The rows ``index`` (a 1-D integer tensor), as rows of their own (a sparse matrix's
        stay sparse)."""
        if not self.sparse:
            return RowBlocks(self.matrix[index], self.shift, self.dtype)
        indptr, indices, values, n_columns = self.csr
        index = index.to(indptr.device, torch.long)
        starts, counts = indptr[index], indptr[index + 1] - indptr[index]
        ends = torch.cumsum(counts, 0)
        # the entries of the taken rows: each row's run in the matrix, one after the other
        entries = torch.arange(int(ends[-1]) if ends.numel() else 0, device=indptr.device)
        entries += torch.repeat_interleave(starts - (ends - counts), counts)
        taken = (torch.cat([ends.new_zeros(1), ends]), indices[entries], values[entries],
                 n_columns)
        return RowBlocks(None, self.shift, self.dtype, taken)

    def rows(self, index):
        """The rows ``index`` as one dense tensor."""
        return self.take(index).dense()

    def blocks(self, row_bytes, working_memory=None):
        """``(start, stop, block)`` over all rows: one block when blocks are views of a dense
        matrix (nothing to bound), else blocks whose ``row_bytes`` plus their copies fit the
        budget."""
        n = self.shape[0]
        rows = n if not self.copies else plan_rows(
            n, row_bytes=row_bytes + self.copy_bytes(), budget=budget_bytes(working_memory)
        )
        for start in range(0, n, max(rows, 1)):
            stop = min(n, start + rows)
            yield start, stop, self.block(start, stop)

    def _densified(self, start, stop):
        indptr, indices, values, n_columns = self.csr
        first, last = int(indptr[start]), int(indptr[stop])
        counts = indptr[start + 1 : stop + 1] - indptr[start:stop]
        rows = torch.repeat_interleave(torch.arange(stop - start, device=self.device), counts)
        out = torch.zeros((stop - start, n_columns), dtype=values.dtype, device=self.device)
        return out.index_put_(
            (rows, indices[first:last]), values[first:last], accumulate=True
        )


def as_row_blocks(X, shift=None):
    """``X`` (a dense tensor or :class:`RowBlocks`) as row blocks, minus ``shift``."""
    return X.shifted(shift) if isinstance(X, RowBlocks) else RowBlocks(X, shift)
