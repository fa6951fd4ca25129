"""How many partition handles a fetch worker keeps (workers/fetcher.py, handle_limit): sized by
its descriptor and map limits so a consumer group over 10,000 partitions (issue 32 goal 6) does
not reopen most of its partitions on every fetch, never below the old fixed table."""

from workers.fetcher import FDS_PER_HANDLE, MAX_HANDLES, RESERVED, handle_limit


def test_a_small_open_files_limit_keeps_the_fixed_table():
    assert handle_limit(1024, 65530) == MAX_HANDLES
    assert handle_limit(4096, 65530) == MAX_HANDLES


def test_the_open_files_limit_sizes_the_table():
    assert handle_limit(20000, 65530) == (20000 - RESERVED) // FDS_PER_HANDLE


def test_vm_max_map_count_bounds_a_large_open_files_limit():
    # systemd's LimitNOFILE=1048576: the kernel's default map count is then the bound, and it
    # leaves room for a 10,000-partition group.
    n = handle_limit(1048576, 65530)
    assert n == (65530 - RESERVED) // FDS_PER_HANDLE
    assert n >= 10000


class _FakeHandle:
    def __init__(self) -> None:
        self.waiters = 0
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _fetcher(max_handles: int):
    import collections

    from workers.fetcher import Fetcher
    f = object.__new__(Fetcher)        # only the handle table: no worker loop, no process
    f.handles = collections.OrderedDict()
    f.max_handles = f._evict_at = max_handles
    return f


def _open(f, key, held: bool):
    h = _FakeHandle()
    h.waiters = int(held)
    f._add_handle(key, h)          # what Fetcher._handle does with a handle it opened
    return h


def test_regression_every_handle_held_by_long_polls_walked_the_table_for_each_handle_opened():
    # Four consumers parked on 2,500 partitions each held a full table: each handle opened
    # after that walked all of them and closed none (the fetcher's time went to the walk).
    f = _fetcher(100)
    walks = []
    evict = f._evict
    f._evict = lambda keep: (walks.append(keep), evict(keep))
    held = [_open(f, i, held=True) for i in range(100)]
    for i in range(100, 200):
        _open(f, i, held=False)
    assert len(walks) <= 100 // (100 // 4) + 1      # a walk per quarter table, not per handle
    assert not any(h.closed for h in held)
    # Once the long-polls are answered, the next walk brings the table back under its limit.
    for h in held:
        h.waiters = 0
    before = len(walks)
    for i in range(1000, 1200):
        _open(f, i, held=False)
        if len(walks) > before:
            break
    assert len(walks) == before + 1
    assert len(f.handles) <= 100 * 3 // 4
    assert f._evict_at == 100


class _Page:
    def __init__(self) -> None:
        self.seq = 2


class _PagedHandle(_FakeHandle):
    def __init__(self) -> None:
        super().__init__()
        self.page = _Page()


def test_regression_every_turn_evaluated_every_parked_fetch_again():
    # Four consumers parked on 2,500 partitions each: every request that woke the fetcher read
    # all 10,000 partitions again. A parked fetch is evaluated again only when one of its pages
    # moved, the catalog changed, or its deadline passed.
    import time
    import types

    from workers.fetcher import Fetcher, Parked
    f = object.__new__(Fetcher)
    catalog = types.SimpleNamespace(version=7)
    f.catalog = types.SimpleNamespace(get=lambda: catalog)
    evaluated, answered = [], []

    def evaluate(req, seqs):
        evaluated.append(req)
        seqs.extend([2, 2])            # what the pages held when this evaluation read them
        return "resp", 0, False
    f._evaluate = evaluate
    f._unpark = lambda p: None
    handles = [_PagedHandle(), _PagedHandle()]
    p = Parked(answered.append, types.SimpleNamespace(min_bytes=1), time.monotonic() + 60, handles,
               [2, 2], 7)
    f.parked = [p]
    f._recheck_parked()
    assert evaluated == [] and f.parked == [p]
    handles[1].page.seq = 4                      # data arrived on one partition
    f._recheck_parked()
    assert len(evaluated) == 1 and f.parked == [p]
    f._recheck_parked()                          # the evaluation saw 2, 2: the page moved since
    assert len(evaluated) == 2
    handles[1].page.seq = 2
    catalog.version = 8                          # a topic deleted or changed
    f._recheck_parked()
    assert len(evaluated) == 3
    f._recheck_parked()
    assert len(evaluated) == 3                   # nothing moved since
    p.deadline = time.monotonic() - 1
    f._recheck_parked()
    assert len(evaluated) == 4 and answered and f.parked == []
