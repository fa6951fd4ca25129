"""``appliance dump-log FILE...``: Kafka's kafka-dump-log.sh, offline, on the files of a data dir:
the batches of a ``.log`` segment (offsets, producer id, epoch, sequences, transactional and
control flags, the COMMIT/ABORT markers, CRC check; with ``--print-data-log`` every record), and
the entries of ``.index``, ``.timeindex`` and ``.txnindex`` files, with ``--index-sanity-check``
and ``--verify-index-only``.

Runs in the user's shell; reads files only (read-only maps), so it is safe beside a running
appliance. The active segment's files are preallocated: the listing stops at the first empty
header, which is where the log ends.
"""

from __future__ import annotations

import json
import mmap
import os
import sys

import click

from appliance.cli import main
from appliance.log.files import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX

# appliance.protocol.records (and through it kio, crc32c) is imported by the functions that
# read batches: ``appliance`` imports this module for every command, most of which read none.

CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
CONTROL_TYPES = {0: "ABORT", 1: "COMMIT"}


def _base_offset(path: str) -> int:
    stem = os.path.basename(path).split(".", 1)[0]
    if not stem.isdigit():
        raise click.ClickException(f"{path}: not a segment file (its name is not <base offset>.<suffix>)")
    return int(stem)


def _map(path: str):
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) if size else b""
    finally:
        os.close(fd)


class Out:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def line(self, text: str, obj: dict | None = None) -> None:
        if self.as_json:
            if obj is not None:
                click.echo(json.dumps(obj, default=str))
        else:
            click.echo(text)


def _printable(b: bytes | None) -> str:
    if b is None:
        return "null"
    return b.decode("utf-8", "backslashreplace")


def dump_segment(path: str, out: Out, *, records: bool, data: bool, max_bytes: int) -> bool:
    from appliance.protocol.records import (HEADER_SIZE, batch_crc_ok, decode_records,
                                            iter_batch_headers, parse_control_record)
    base = _base_offset(path)
    m = _map(path)
    ok = True
    try:
        out.line(f"Log starting offset: {base}", {"file": path, "log_starting_offset": base})
        end = min(len(m), max_bytes) if max_bytes else len(m)
        last_end = 0
        for pos, h in iter_batch_headers(m, 0, end):
            size = h.batch_length + 12
            valid = h.magic == 2 and batch_crc_ok(m, pos, size, h.crc)
            ok = ok and valid
            last_end = pos + size
            count = h.records_count
            last_seq = -1 if h.base_sequence < 0 else (h.base_sequence + h.last_offset_delta) % (1 << 31)
            ts_type = "LogAppendTime" if h.timestamp_type else "CreateTime"
            fields = {"baseOffset": h.base_offset, "lastOffset": h.last_offset, "count": count,
                      "baseSequence": h.base_sequence, "lastSequence": last_seq,
                      "producerId": h.producer_id, "producerEpoch": h.producer_epoch,
                      "partitionLeaderEpoch": h.partition_leader_epoch,
                      "isTransactional": h.is_transactional, "isControl": h.is_control,
                      "position": pos, ts_type: h.max_timestamp, "size": size, "magic": h.magic,
                      "compresscodec": CODECS.get(h.compression, str(h.compression)),
                      "crc": h.crc, "isvalid": valid}
            out.line(" ".join(f"{k}: {_fmt(v)}" for k, v in fields.items()), {"batch": fields})
            if not (records or h.is_control) or not valid:
                continue
            batch = m[pos:pos + size]
            try:
                recs = decode_records(batch)
            except Exception as e:          # noqa: BLE001 - a damaged batch is reported, not fatal
                out.line(f"| records unreadable: {e}", {"records_error": str(e)})
                ok = False
                continue
            for i, r in enumerate(recs):
                rec = {"offset": r.offset, ts_type: r.timestamp,
                       "keySize": -1 if r.key is None else len(r.key),
                       "valueSize": -1 if r.value is None else len(r.value),
                       "sequence": -1 if h.base_sequence < 0 else (h.base_sequence + (r.offset - h.base_offset)) % (1 << 31),
                       "headerKeys": [k for k, _ in r.headers]}
                if h.is_control:
                    try:
                        ctype, epoch = parse_control_record(batch)
                        rec["endTxnMarker"] = CONTROL_TYPES.get(ctype, str(ctype))
                        rec["coordinatorEpoch"] = epoch
                    except Exception as e:  # noqa: BLE001
                        rec["controlRecordError"] = str(e)
                elif data:
                    rec["key"] = _printable(r.key)
                    rec["payload"] = _printable(r.value)
                if not records and not h.is_control:
                    continue
                out.line("| " + " ".join(f"{k}: {_fmt(v)}" for k, v in rec.items()), {"record": rec})
        # The log ends at the first empty header (the rest of a preallocated file is zeros);
        # anything else there is a torn or damaged batch.
        if m[last_end:min(end, last_end + HEADER_SIZE)].strip(b"\0"):
            ok = False
            out.line(f"Found invalid bytes at position {last_end} (a torn or damaged batch: "
                     "recovery truncates there)", {"invalid_bytes_at": last_end})
    finally:
        if isinstance(m, mmap.mmap):
            m.close()
    return ok


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(map(str, v)) + "]"
    return str(v)


def _segment_log(path: str) -> str | None:
    log = path.rsplit(".", 1)[0] + LOG_SUFFIX
    return log if os.path.exists(log) else None


def _log_batch_at(log_map, position: int):
    from appliance.protocol.records import HEADER_SIZE, read_header
    if position + HEADER_SIZE > len(log_map):
        return None
    h = read_header(log_map, position)
    if h.batch_length + 12 < HEADER_SIZE or position + h.batch_length + 12 > len(log_map):
        return None
    return h


def dump_index(path: str, out: Out, *, sanity_only: bool, verify_only: bool) -> bool:
    from appliance.log.index import CorruptIndex, OffsetIndex, TimeIndex
    base = _base_offset(path)
    time_index = path.endswith(TIMEINDEX_SUFFIX)
    cls = TimeIndex if time_index else OffsetIndex
    log = _segment_log(path)
    ix = cls(path, base)
    try:
        if sanity_only:
            try:
                log_size = os.path.getsize(log) if log and not time_index else None
                ix.sanity_check(log_size)
            except CorruptIndex as e:
                out.line(f"{path}: {e}", {"file": path, "sane": False, "error": str(e)})
                return False
            out.line(f"{path} passed sanity check.", {"file": path, "sane": True})
            return True
        log_map = _map(log) if (verify_only and log) else None
        ok = True
        try:
            for n in range(ix.entries):
                if time_index:
                    ts, off = ix.entry(n)
                    entry = {"timestamp": ts, "offset": off}
                else:
                    off, position = ix.entry(n)
                    entry = {"offset": off, "position": position}
                if log_map is not None:
                    problem = _verify_entry(log_map, entry, time_index)
                    if problem:
                        ok = False
                        out.line(f"{' '.join(f'{k}: {v}' for k, v in entry.items())}: {problem}",
                                 {"entry": entry, "mismatch": problem})
                    continue
                if not verify_only:
                    out.line(" ".join(f"{k}: {v}" for k, v in entry.items()), {"entry": entry})
            if verify_only and log_map is None:
                out.line(f"{path}: no {LOG_SUFFIX} file beside it to verify against", {"verified": False})
                return False
            if verify_only and ok:
                out.line(f"{path}: every entry matches the log.", {"verified": True})
        finally:
            if isinstance(log_map, mmap.mmap):
                log_map.close()
        return ok
    finally:
        ix.close()


def _verify_entry(log_map, entry: dict, time_index: bool) -> str | None:
    """Kafka's --verify-index-only: an offset entry must point at the batch whose last offset it
    names; a time entry's offset must be a batch's last offset with that max timestamp."""
    from appliance.protocol.records import iter_batch_headers
    if not time_index:
        h = _log_batch_at(log_map, entry["position"])
        if h is None:
            return "no batch at that position"
        if h.last_offset != entry["offset"]:
            return f"the batch there ends at offset {h.last_offset}"
        return None
    for _, h in iter_batch_headers(log_map):
        if h.last_offset == entry["offset"]:
            return None if h.max_timestamp == entry["timestamp"] else \
                f"the batch ending there has max timestamp {h.max_timestamp}"
        if h.base_offset > entry["offset"]:
            break
    return "no batch ends at that offset"


def dump_txn_index(path: str, out: Out, *, sanity_only: bool) -> bool:
    from appliance.log.txn_index import read_entries, sane
    from appliance.protocol.records import iter_batch_headers
    base = _base_offset(path)
    log = _segment_log(path)
    next_offset = base
    if log:
        m = _map(log)
        try:
            for _, h in iter_batch_headers(m):
                next_offset = h.last_offset + 1
        finally:
            if isinstance(m, mmap.mmap):
                m.close()
    if sanity_only:
        good = sane(path, base, next_offset if log else (1 << 63) - 1)
        out.line(f"{path} passed sanity check." if good else f"{path}: failed the sanity check "
                 "(entries out of order, outside the segment, or of an unknown version)",
                 {"file": path, "sane": good})
        return good
    try:
        entries = read_entries(path)
    except ValueError as e:
        out.line(f"{path}: {e}", {"error": str(e)})
        return False
    for e in entries:
        entry = {"version": 0, "producerId": e.producer_id, "firstOffset": e.first_offset,
                 "lastOffset": e.last_offset, "lastStableOffset": e.last_stable_offset}
        out.line(" ".join(f"{k}: {v}" for k, v in entry.items()), {"entry": entry})
    return True


@main.command("dump-log")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--print-data-log", is_flag=True, help="Print every record with its key and payload.")
@click.option("--deep-iteration", is_flag=True, help="Print every record (without key and payload).")
@click.option("--index-sanity-check", is_flag=True,
              help=".index/.timeindex/.txnindex: only check the file's structure (the check a start "
                   "runs before it trusts an index).")
@click.option("--verify-index-only", is_flag=True,
              help=".index/.timeindex: check every entry against the segment's .log, print only mismatches.")
@click.option("--max-bytes", type=int, default=0, help=".log: stop after this many bytes (0: whole file).")
@click.option("--verify", is_flag=True,
              help="Only look for damage (bit rot, torn files) in the FILES or directories (a "
                   "partition's, or the whole data dir): every batch's CRC, every index entry, "
                   "aborted-transaction indexes, producer snapshots, catalog, credentials and "
                   "ACL files. One line per damaged place (file, position, offset); exit 1 if any.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def dump_log(files, print_data_log, deep_iteration, index_sanity_check, verify_index_only, max_bytes,
             verify, as_json) -> None:
    """Print the contents of segment and index files of a data dir (Kafka's kafka-dump-log.sh),
    offline. Exits 1 when a batch fails its CRC or an index fails its check."""
    out = Out(as_json)
    if verify:
        from appliance.cli.verify_log import verify_paths
        n, problems = verify_paths(list(files))
        for p in problems:
            out.line(p.line(), {"file": p.path, "position": p.position, "offset": p.offset,
                                "problem": p.reason})
        out.line(f"Verified {n} files: {len(problems)} problems" if problems else
                 f"Verified {n} files: no damage found", {"files": n, "problems": len(problems)})
        sys.exit(1 if problems else 0)
    for path in files:
        if os.path.isdir(path):
            raise click.BadParameter(f"{path} is a directory (only --verify takes directories)",
                                     param_hint="FILES")
    ok = True
    for path in files:
        out.line(f"Dumping {path}", {"dumping": path})
        try:
            if path.endswith(LOG_SUFFIX):
                ok &= dump_segment(path, out, records=print_data_log or deep_iteration, data=print_data_log,
                                   max_bytes=max_bytes)
            elif path.endswith(INDEX_SUFFIX) or path.endswith(TIMEINDEX_SUFFIX):
                ok &= dump_index(path, out, sanity_only=index_sanity_check, verify_only=verify_index_only)
            elif path.endswith(TXNINDEX_SUFFIX):
                ok &= dump_txn_index(path, out, sanity_only=index_sanity_check)
            else:
                click.echo(f"Ignoring unknown file {path} (not .log, .index, .timeindex or .txnindex)",
                           err=True)
                ok = False
        except (OSError, ValueError) as e:
            click.echo(f"Error: {path}: {e}", err=True)
            ok = False
    sys.exit(0 if ok else 1)
