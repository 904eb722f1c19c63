"""MeasuredThreads: the thread count of a loop of like steps follows the steps' measured
times (a fake clock here: which count runs each step, not how fast it is)."""

import pytest
import torch

from skattention._engine import MeasuredThreads, _measured_threads, cpu_threads


class FakeSteps:
    """A clock advanced by each step's body: ``cost(count, i)`` seconds per unit of work for
    the ``i``-th step on ``count`` threads; records the count each step ran on."""

    def __init__(self, cost):
        self.now, self.cost, self.counts = 0.0, cost, []

    def clock(self):
        return self.now

    def run(self, threads, n_steps, work=10):
        for _ in range(n_steps):
            with threads.step(work):
                count = torch.get_num_threads()
                self.now += work * self.cost(count, self.counts.count(count))
                self.counts.append(count)


def _steps(cost, n_steps, most=4):
    fake = FakeSteps(cost)
    with cpu_threads(most):
        threads = MeasuredThreads(torch.device("cpu"), clock=fake.clock)
        fake.run(threads, n_steps)
        assert torch.get_num_threads() == most  # restored after every step
    return fake.counts, threads


def test_the_callers_count_stays_where_it_is_fastest():
    counts, threads = _steps(lambda count, i: {4: 1.0, 2: 1.6, 1: 3.0}[count], 40)
    # half the threads tried after the first two steps, lost (the interval doubled), again later
    probe = 3 + 2 * _measured_threads._PROBE_INTERVAL
    assert counts[2] == 2 and counts[probe] == 2
    assert all(c == 4 for i, c in enumerate(counts) if i not in (2, probe))
    assert threads.current == 4


def test_fewer_threads_replace_the_count_where_they_are_faster():
    counts, threads = _steps(lambda count, i: {4: 1.0, 2: 0.5, 1: 0.3}[count], 80)
    assert counts[:3] == [4, 4, 2]
    # on 2 threads from the probe on; the neighbours tried in turn (4 loses, then 1 wins)
    up = 3 + _measured_threads._PROBE_INTERVAL
    down = up + 1 + 2 * _measured_threads._PROBE_INTERVAL
    assert set(counts[3:up]) == {2} and counts[up] == 4
    assert set(counts[up + 1:down]) == {2} and counts[down] == 1
    back = down + 1 + _measured_threads._PROBE_INTERVAL  # 2 tried again, lost
    assert counts[back] == 2 and set(counts[down:back] + counts[back + 1:]) == {1}
    assert threads.current == 1
    with threads.chosen():
        assert torch.get_num_threads() == 1


def test_a_probe_close_to_the_current_count_runs_a_second_step():
    # the first step on fewer threads pays for the spinning threads of the steps before it
    counts, threads = _steps(lambda count, i: 1.0 if count == 4 else (1.1 if i == 0 else 0.6),
                             10)
    assert counts[:5] == [4, 4, 2, 2, 2] and threads.current == 2
    # a probe clearly slower ends after one step
    counts, _ = _steps(lambda count, i: 1.0 if count == 4 else 1.5, 10)
    assert counts[:4] == [4, 4, 2, 4]


@pytest.mark.parametrize(("most", "device"), [(1, "cpu"), (2, "meta")])
def test_a_single_thread_or_an_accelerator_keeps_the_callers_count(most, device):
    # the meta device stands for an accelerator: its steps' CPU threads are not measured
    with cpu_threads(most):
        fake = FakeSteps(lambda count, i: 1.0 if count == most else 0.1)
        fake.run(MeasuredThreads(torch.device(device), clock=fake.clock), 10)
    assert set(fake.counts) == {most}
