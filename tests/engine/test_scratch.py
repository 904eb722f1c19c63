"""Scratch buffers kept from step to step within a training loop (``_scratch``)."""

import threading

import torch

from skattention._engine._scratch import reused_buffers, scratch


def test_within_a_loop_the_same_buffer_is_handed_out_again():
    like = torch.empty(0)
    with reused_buffers():
        a = scratch("k", (4, 5), like)
        a.fill_(1.0)
        b = scratch("k", (3, 5), like)  # smaller: a view of the same storage
        assert b.data_ptr() == a.data_ptr() and b.shape == (3, 5)
        c = scratch("other", (4, 5), like)  # another key: another buffer
        assert c.data_ptr() != a.data_ptr()
        d = scratch("k", (8, 5), like)  # larger: grown
        assert d.shape == (8, 5)
        e = scratch("k", (2, 2), torch.empty(0, dtype=torch.float64))  # another dtype: new
        assert e.dtype == torch.float64
        with reused_buffers():  # nested: the same buffers
            assert scratch("k", (2, 2), e).data_ptr() == e.data_ptr()
    # outside: a new tensor each time, nothing kept
    f, g = scratch("k", (4, 5), like), scratch("k", (4, 5), like)
    assert f.shape == (4, 5) and f.data_ptr() != g.data_ptr()


def test_buffers_are_kept_per_thread():
    like = torch.empty(0)
    seen = {}

    def other():
        with reused_buffers():
            seen["other"] = scratch("k", (16, 16), like).data_ptr()

    with reused_buffers():
        mine = scratch("k", (16, 16), like)
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert seen["other"] != mine.data_ptr()
        assert scratch("k", (16, 16), like).data_ptr() == mine.data_ptr()


def test_a_claim_is_released_once_and_only_if_no_later_claim_was_made():
    from skattention._engine._scratch import claim, reusing_buffers

    assert not reusing_buffers()
    with reused_buffers():
        assert reusing_buffers()
        first = claim("kept")
        second = claim("kept")  # takes the buffer
        other = claim("another")
        assert not first.release()
        assert second.release() and not second.release()  # once
        assert other.release()
