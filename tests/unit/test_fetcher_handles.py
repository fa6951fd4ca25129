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


def test_parked_fetches_pages_are_read_only_after_a_ring_that_says_a_page_moved():
    # Issue 32 goal 6: comparing every parked fetch's page sequence numbers on every turn (a
    # request, a tick) was a quarter of the fetcher at 10,000 partitions. A fetch parked this
    # turn is compared once; later only when a writer's ring carried MARK_STATE, its deadline
    # passed or the catalog changed.
    import time
    import types

    from workers.fetcher import Fetcher, Parked
    f = object.__new__(Fetcher)
    catalog = types.SimpleNamespace(version=7)
    f.catalog = types.SimpleNamespace(get=lambda: catalog)
    evaluated = []

    def evaluate(req, seqs):
        evaluated.append(req)
        seqs.extend([h.page.seq for h in handles])
        return "resp", 0, False
    f._evaluate = evaluate
    f._unpark = lambda p: None
    handles = [_PagedHandle(), _PagedHandle()]
    p = Parked(lambda r: None, types.SimpleNamespace(min_bytes=1), time.monotonic() + 60, handles,
               [2, 2], 7)
    f.parked = [p]
    handles[0].page.seq = 4            # moved between its evaluation and its flags being set
    f._recheck_parked(moved=False)     # fresh: compared anyway
    assert len(evaluated) == 1
    handles[1].page.seq = 6
    f._recheck_parked(moved=False)     # no ring said so: not read
    assert len(evaluated) == 1
    f._recheck_parked(moved=True)
    assert len(evaluated) == 2
    catalog.version = 8
    f._recheck_parked(moved=False)
    assert len(evaluated) == 3


def test_a_handle_reopened_while_its_segments_did_not_move_lists_nothing(tmp_path, monkeypatch):
    # Issue 32 goal 6: at 10,000 partitions over a smaller handle table most fetches reopen most
    # of their partitions, and each reopen listed the partition's directory twice (the reader's
    # start and the first state()): a fifth of the fetcher. Now once, and not at all while
    # (generation, segments_version) is what the last listing saw.
    import os
    import types

    import workers.fetcher as fx
    from appliance.log import reader as rd

    page = types.SimpleNamespace(read=lambda: types.SimpleNamespace(generation=3, segments_version=5),
                                 close=lambda: None)
    monkeypatch.setattr(fx.StatePage, "open", staticmethod(lambda *a, **k: page))
    topo = types.SimpleNamespace(page_path=lambda name: name)
    d = tmp_path / "t-0"
    os.makedirs(d)
    (d / ("0" * 20 + ".log")).write_bytes(b"")
    calls = []
    real = rd.list_segment_bases
    monkeypatch.setattr(rd, "list_segment_bases", lambda path, *a: calls.append(path) or real(path, *a))
    listed: dict = {}
    h = fx.PartitionHandle(topo, str(tmp_path), "t", b"\x01" * 16, 0, 1 << 20, False, listed)
    h.state()
    assert len(calls) == 1 and listed[(b"\x01" * 16, 0)] == ((3, 5), [0])
    fx.PartitionHandle(topo, str(tmp_path), "t", b"\x01" * 16, 0, 1 << 20, False, listed).state()
    assert len(calls) == 1                       # reopened: the listing kept
    page.read = lambda: types.SimpleNamespace(generation=4, segments_version=5)
    fx.PartitionHandle(topo, str(tmp_path), "t", b"\x01" * 16, 0, 1 << 20, False, listed)
    assert len(calls) == 2                       # a restarted writer: listed again
