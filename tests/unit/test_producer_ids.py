from appliance.txn.producer_ids import ProducerIdManager


def test_ids_are_unique_and_never_reused_after_restart(tmp_path):
    m = ProducerIdManager(str(tmp_path), block_size=10)
    first = [m.next_id() for _ in range(15)]
    assert first == list(range(15))
    # a crash at any point: the next process starts past every block reserved so far
    again = ProducerIdManager(str(tmp_path), block_size=10)
    nxt = again.next_id()
    assert nxt >= 20 and nxt not in first
