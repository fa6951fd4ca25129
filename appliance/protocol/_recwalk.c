/* The per-record walk of a v2 batch's record data, in C: Kafka's DefaultRecord.readFrom framing
 * and LogValidator's per-record rules, answering only "every record is fine" (True) or "let the
 * Python walk decide" (False).
 *
 * Imported by appliance/protocol/record_contents.py (frontends on every produced batch, writers
 * in recovery); owns nothing, allocates nothing, never raises on bad data. It is deliberately the
 * stricter side: whatever it cannot vouch for (a malformed record, a varint longer or larger
 * than Kafka allows, a timestamp near the edges of int64, a broken rule) returns False, and the
 * Python walk (record_contents._walk / _validate_slow) then refuses the batch with Kafka's error
 * and message, or accepts it. So the rules and their wording live in one place, in Python; this
 * file only makes the common case (a valid batch) cost a few nanoseconds a record instead of a
 * Python object per record.
 *
 * records_ok(data, count, compacted, create_time, base_ts, now, before, after) -> bool
 *   data        the records of the batch (decompressed), any buffer
 *   count       the header's records_count: exactly that many records and no byte after them
 *   compacted   every record must have a key (a null key is refused on compacted topics)
 *   create_time the batch's timestamps are CreateTime: every record's timestamp ts = base_ts +
 *               delta other than -1 must keep now - ts <= before and ts - now <= after
 *               (message.timestamp.before.max.ms / after.max.ms; computed in 128 bits, so
 *               int64 limits and timestamps never overflow)
 * Offset deltas must be 0, 1, ..., count-1 (we store batches as sent, never recompress).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* A zig-zag varint of at most max_len bytes (5: int32, 10: int64, as Kafka's ByteUtils).
 * Returns 0 on a premature end, an over-long varint, or a value outside the type's range. */
static inline int
read_varint(const uint8_t *p, Py_ssize_t end, Py_ssize_t *pos, int max_len, int64_t *out)
{
    uint64_t raw = 0;
    int shift = 0;
    for (int i = 0; i < max_len; i++) {
        if (*pos >= end)
            return 0;
        uint8_t b = p[(*pos)++];
        if (shift == 63 && (b & 0x7E))
            return 0;                               /* bits beyond 64: not a Java long */
        raw |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            if (max_len == 5 && raw > 0xFFFFFFFFu)
                return 0;                           /* bits beyond 32: not a Java int */
            *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            return 1;
        }
        shift += 7;
    }
    return 0;
}

/* Step over a key, value or header value of length len (negative: null, nothing to skip).
 * Returns 0 when it would run past end. */
static inline int
skip_bytes(int64_t len, Py_ssize_t end, Py_ssize_t *pos)
{
    if (len <= 0)
        return 1;
    if (len > end - *pos)
        return 0;
    *pos += (Py_ssize_t)len;
    return 1;
}

static PyObject *
records_ok(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t count;
    int compacted, create_time;
    long long base_ts, now, before, after;
    if (!PyArg_ParseTuple(args, "y*nppLLLL", &view, &count, &compacted, &create_time, &base_ts,
                          &now, &before, &after))
        return NULL;
    const uint8_t *p = (const uint8_t *)view.buf;
    const Py_ssize_t n = view.len;
    Py_ssize_t pos = 0;
    int ok = count >= 0;
    for (Py_ssize_t index = 0; ok && index < count; index++) {
        int64_t length, ts_delta, offset_delta, key_len, value_len, headers, hk, hv;
        ok = 0;
        if (!read_varint(p, n, &pos, 5, &length) || length < 0 || length > n - pos)
            break;
        const Py_ssize_t end = pos + (Py_ssize_t)length;    /* everything below stays inside */
        if (pos >= end)
            break;
        pos++;                                              /* attributes (unused in v2) */
        if (!read_varint(p, end, &pos, 10, &ts_delta) || !read_varint(p, end, &pos, 5, &offset_delta))
            break;
        if (offset_delta != index)
            break;
        if (!read_varint(p, end, &pos, 5, &key_len))
            break;
        if ((key_len < 0 && compacted) || !skip_bytes(key_len, end, &pos))
            break;
        if (!read_varint(p, end, &pos, 5, &value_len) || !skip_bytes(value_len, end, &pos))
            break;
        if (!read_varint(p, end, &pos, 5, &headers) || headers < 0 || headers > end - pos)
            break;
        int64_t h;
        for (h = 0; h < headers; h++) {
            if (!read_varint(p, end, &pos, 5, &hk) || hk < 0 || !skip_bytes(hk, end, &pos))
                break;
            if (!read_varint(p, end, &pos, 5, &hv) || !skip_bytes(hv, end, &pos))
                break;
        }
        if (h != headers || pos != end)
            break;
        if (create_time) {
            __int128 ts = (__int128)base_ts + ts_delta;
            if (ts != -1 && ((__int128)now - ts > before || ts - now > after))
                break;
        }
        ok = 1;
    }
    if (ok && pos != n)
        ok = 0;                                             /* bytes after the last record */
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"records_ok", records_ok, METH_VARARGS,
     "records_ok(data, count, compacted, create_time, base_ts, now, before, after) -> bool: "
     "True when "
     "every record of the batch's record data is framed as Kafka reads it and keeps the "
     "per-record rules; False when the Python walk must decide."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_recwalk",
    "The per-record walk of produced batches in C (see record_contents.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__recwalk(void)
{
    return PyModule_Create(&module);
}
