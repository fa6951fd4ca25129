"""Where a partition's writer runs (appliance.supervisor.placement): a process each under the
budget, the least-loaded process past it; explicit writer hosts of K; the budget's default."""

from appliance.supervisor.placement import place, process_budget


def test_a_process_each_up_to_the_budget():
    counts: dict[str, int] = {}
    assert place(counts, 3, budget=4) == ["new0", "new1", "new2"]
    assert counts == {"new0": 1, "new1": 1, "new2": 1}


def test_past_the_budget_the_least_loaded_process_takes_it():
    counts = {"wp0": 2, "wp1": 1, "wp2": 1}
    assert place(counts, 4, budget=3) == ["wp1", "wp2", "wp0", "wp1"]
    assert counts == {"wp0": 3, "wp1": 3, "wp2": 2}


def test_a_start_spreads_ten_thousand_partitions_evenly_over_the_budget():
    counts: dict[str, int] = {}
    out = place(counts, 10_000, budget=8)
    assert len(counts) == 8 and set(counts.values()) == {1250}
    assert out[:8] == [f"new{i}" for i in range(8)] and out[8] == "new0"


def test_explicit_hosts_fill_k_before_the_next_and_ignore_the_budget():
    counts: dict[str, int] = {}
    out = place(counts, 7, budget=1, per_writer=3)
    assert out == ["new0", "new0", "new0", "new1", "new1", "new1", "new2"]


def test_the_budget_is_four_per_core_at_least_four():
    assert process_budget(0, cores=2) == 8
    assert process_budget(0, cores=1) == 4
    assert process_budget(3, cores=64) == 3


def test_the_memory_check_counts_each_new_process_once(tmp_path):
    """Regression: a CreateTopics of 900 partitions past nothing was counted as 900 new writer
    processes (each placement on a new process), and refused as needing 23 GiB."""
    from appliance.supervisor.writers import WriterTable
    table = WriterTable(topo=None, new_process=None, forget_worker=None, publish_version=None)
    table.configure(8, 1)
    assert table.new_processes_for(900) == 8
    table.configure(0, 100)
    assert table.new_processes_for(900) == 9
