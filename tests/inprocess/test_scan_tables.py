"""The scannable tables (store/scan.py): BucketedDict and JobIndex against a
dict, colliding IDs filling and draining one bucket, iteration while
deleting."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disque.store.job import Job
from disque.store.scan import MIN_SLOTS, NBUCKETS, BucketedDict, JobIndex


ops = st.lists(
    st.tuples(st.sampled_from(["add", "pop", "scan"]), st.integers(0, 300), st.integers(1, 20), st.integers(1, 4)),
    max_size=200,
)


@settings(max_examples=100, deadline=None)
@given(ops)
def test_bucketed_dict_against_a_dict(ops):
    table, model = BucketedDict(), {}
    for op, n, want, max_buckets in ops:
        key = n if n % 2 else n * NBUCKETS // 4  # even keys share four buckets
        if op == "add":
            table.add(key, key)
            model[key] = key
        elif op == "pop":
            assert table.pop(key) == model.pop(key, None)
        else:
            seen, cursor = [], 0
            while True:
                cursor, got = table.scan(cursor, want, max_buckets)
                seen += got
                if not cursor:
                    break
            assert sorted(seen) == sorted(model)  # everything, once
            start = key % NBUCKETS
            assert sorted(table.values_from(start)) == sorted(model)
        assert len(table) == len(model) and sorted(table.values()) == sorted(model)
        assert all(key in table and table.get(key) == key for key in model)
    assert table.scan(NBUCKETS, 10, None) == (0, [])
    table.clear()
    assert len(table) == 0 and table.scan(0, 10, None) == (0, [])


def _ids_in_one_bucket(n):
    """`n` job IDs that share an index bucket, so that they collide in its table."""
    by_bucket = {}
    for i in itertools.count():
        job_id = b"DI%08x%032x0001SQ" % (1, i)
        same = by_bucket.setdefault(hash(job_id) % NBUCKETS, [])
        same.append(job_id)
        if len(same) == n:
            return same


CROWD = _ids_in_one_bucket(40)
# IDs of other buckets: one in CROWD's would make its table hold more than the crowd
OTHERS = [job_id for i in range(40) if hash(job_id := b"DI%08x%032x0001SQ" % (2, i)) % NBUCKETS != hash(CROWD[0]) % NBUCKETS][:20]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "replace", "pop"]), st.integers(0, 59)), max_size=300))
def test_job_index_against_a_dict(ops):
    """IDs of one bucket (colliding runs, wrapping, growing and shrinking
    tables) and of others: every registered job is found after each step."""
    index, model = JobIndex(), {}
    others = OTHERS
    for op, n in ops:
        job_id = (CROWD + others)[n]
        if op == "pop":
            assert index.pop(job_id) is model.pop(job_id, None)
        else:
            job = Job(job_id, b"q", b"body")
            if op == "add" or job_id not in model:
                index.add(job)
                model[job_id] = job
        assert len(index) == len(model)
        assert all(index.get(job_id) is job for job_id, job in model.items())
        assert all(job_id not in index for job_id in CROWD + others if job_id not in model)
    assert sorted(j.id for j in index.values()) == sorted(model)
    table = index._tables[hash(CROWD[0]) % NBUCKETS]  # sized to its load: under 3/4 used, over 1/6 live unless minimal
    count = sum(job_id in model for job_id in CROWD)
    assert (table is None) == (count == 0)
    if table is not None:
        size = len(table.tags)
        assert table.live == count == sum(job is not None for job in table.jobs) and table.used == sum(map(bool, table.tags))
        assert 4 * table.used <= 3 * size and (size == MIN_SLOTS or 6 * count >= size)


@pytest.mark.parametrize("seed", range(5))
def test_job_index_fills_and_drains_one_bucket(seed):
    """Colliding IDs added, then popped in a random order: the backward
    shift keeps every other job reachable and the table shrinks back."""
    index, order = JobIndex(), list(CROWD)
    for job_id in order:
        index.add(Job(job_id, b"q", b"body"))
    random.Random(seed).shuffle(order)
    sizes = set()
    for n, job_id in enumerate(order):
        assert index.pop(job_id).id == job_id and index.pop(job_id) is None
        table = index._tables[hash(job_id) % NBUCKETS]
        sizes.add(len(table.tags) if table is not None else 0)
        assert all(index.get(other).id == other for other in order[n + 1 :])
    assert len(index) == 0 and not index.bucket(hash(CROWD[0]) % NBUCKETS) and index.scan(0, 10, None) == (0, [])
    assert {MIN_SLOTS, 0} < sizes  # it shrank step by step, then emptied


def test_values_from_survives_deleting_the_current_element():
    table, keys = BucketedDict(), list(range(40)) + [NBUCKETS * n for n in range(1, 10)]  # some share bucket 0
    for key in keys:
        table.add(key, key)
    seen = []
    for value in table.values_from(7):
        seen.append(value)
        table.pop(value)
    assert sorted(seen) == keys and len(table) == 0
