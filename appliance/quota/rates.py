"""The frontends' quota accounting: Kafka's windowed rates and throttle decisions, sans-IO.

Runs in each frontend (``workers/frontend/broker.py`` holds one ``ClientQuotas``; the connection
asks it per request and carries out the throttle it returns). Owns this frontend's share of every
quota sensor: the samples of what its own connections did, per quota type and metric tags.

Kafka's model (ClientQuotaManager, ClientRequestQuotaManager, ``Rate`` over a ``SampledStat``):
a sensor per (quota type, user tag, client-id tag) keeps ``quota.window.num`` samples of
``quota.window.size.seconds`` each (``[quotas] window_num``, ``window_size_seconds``; 11 and 1 as
Kafka); the rate is the samples' sum over the window's length (at least ``window_num - 1``
whole windows, so that a new client is not judged on its first milliseconds). A request is
recorded first, then the rate is checked: above the bound, the throttle is the time the rate
takes to fall back to the bound if nothing more came, ``(rate - bound) / bound * window``
(QuotaUtils.throttleTime), at most one window for request_percentage (as Kafka bounds it).

Across frontends (a client with connections to two frontends is one client to Kafka): each
frontend publishes its sensors' samples (``snapshot``, at most every ``PUBLISH_S``, each frontend
tick, only while it has live sensors) and reads the others' (``merge``); a rate is the sum of this frontend's
samples, current to the request, and the others' last published ones. What another frontend
recorded in its last ``PUBLISH_S`` is not seen yet: a client spread over k frontends may exceed
its bound by what k - 1 frontends take in that time, which the next throttle (computed over the
whole window) takes back.
"""

from __future__ import annotations

import math

import msgspec

from appliance.quota import model

PRODUCE, FETCH, REQUEST, CONNECTION = "Produce", "Fetch", "Request", "Connection"
MUTATION = "ControllerMutation"
KEY_OF = {PRODUCE: model.PRODUCER_BYTE_RATE, FETCH: model.CONSUMER_BYTE_RATE,
          REQUEST: model.REQUEST_PERCENTAGE, CONNECTION: model.CONNECTION_CREATION_RATE,
          MUTATION: model.CONTROLLER_MUTATION_RATE}
PUBLISH_S = 0.02
# Each frontend's published usage in the runtime dir: USAGE_PREFIX + frontend + ".msgpack".
USAGE_PREFIX = "quota_usage."
# request_percentage counts nanoseconds of a frontend's time as percent of one second.
NANOS_TO_PERCENTAGE = 100.0 / 1e9

Tags = tuple[str, str]          # (user, client-id); for CONNECTION (ip, "")


class Sampled:
    """Kafka's SampledStat: ``samples`` of [start ms, value, count], newest last."""

    __slots__ = ("samples",)

    def __init__(self) -> None:
        self.samples: list[list[float]] = []

    def record(self, value: float, now_ms: int, num: int, size_ms: int) -> None:
        s = self.samples
        if not s or now_ms - s[-1][0] >= size_ms:
            s.append([now_ms, value, 1])
            if len(s) > num:
                del s[0]
        else:
            last = s[-1]
            last[1] += value
            last[2] += 1

    def live(self, now_ms: int, num: int, size_ms: int) -> list[list[float]]:
        """The samples still in the window (Kafka's purgeObsoleteSamples)."""
        expire = now_ms - num * size_ms
        s = self.samples
        while s and s[0][0] <= expire:
            del s[0]
        return s


def window_ms(oldest_start: float | None, now_ms: int, num: int, size_ms: int) -> float:
    """Kafka's Rate.windowSize: the time since the oldest sample, at least num - 1 windows."""
    elapsed = now_ms - (oldest_start if oldest_start is not None else now_ms)
    full = int(elapsed // size_ms)
    if full < num - 1:
        elapsed += (num - 1 - full) * size_ms
    return max(elapsed, 1)


class Sensor:
    __slots__ = ("rate", "throttle", "bound")

    def __init__(self, bound: float) -> None:
        self.rate = Sampled()
        self.throttle = Sampled()       # throttle times given (Kafka's throttle-time, an Avg)
        self.bound = bound


class TokenBucket:
    """KIP-599's controller mutation quota (Kafka's TokenBucket): ``burst`` = rate x window_num x
    window size tokens, refilled at the rate; a mutation takes as many tokens as it changes
    partitions and may take the bucket below zero; the throttle is the time to refill to zero."""

    __slots__ = ("tokens", "last_ms")

    def __init__(self, burst: float, now_ms: int) -> None:
        self.tokens = burst
        self.last_ms = now_ms

    def refill(self, rate: float, burst: float, now_ms: int) -> float:
        self.tokens = min(burst, self.tokens + rate * max(now_ms - self.last_ms, 0) / 1000.0)
        self.last_ms = now_ms
        return self.tokens


class ClientQuotas:
    """One frontend's quota sensors and decisions. Single-threaded; every time is passed in."""

    def __init__(self, window_num: int = 11, window_size_s: int = 1) -> None:
        self.num = window_num
        self.size_ms = window_size_s * 1000
        self.by_key: dict[str, dict[model.Entity, float]] = {}
        self.enabled: dict[str, bool] = dict.fromkeys(KEY_OF, False)
        self.any = False
        self._governing: dict[tuple, tuple[float, Tags] | None] = {}
        self.sensors: dict[tuple[str, Tags], Sensor] = {}
        # (type, tags) -> samples published by the other frontends, by frontend
        self.others: dict[tuple[str, Tags], dict[str, list]] = {}
        self.dirty = False
        self.buckets: dict[Tags, TokenBucket] = {}     # controller_mutation_rate, this frontend's

    # -- configuration --------------------------------------------------------------------------
    def settings(self, window_num: int, window_size_s: int) -> None:
        self.num, self.size_ms = window_num, window_size_s * 1000

    def configure(self, quotas: model.Quotas) -> None:
        """A new published quota table: bounds change at once, samples are kept (Kafka's
        updateQuota keeps the sensor and changes its quota)."""
        self.by_key = model.by_key(quotas)
        self.enabled = {t: bool(self.by_key.get(k)) for t, k in KEY_OF.items()}
        self.any = any(self.enabled.values())
        self._governing.clear()
        self.dirty = True

    def governing(self, qtype: str, user: str, client_id: str) -> tuple[float, Tags] | None:
        k = (qtype, user, client_id)
        try:
            return self._governing[k]
        except KeyError:
            pass
        table = self.by_key.get(KEY_OF[qtype], {})
        if qtype == CONNECTION:
            bound = table.get(((model.IP, user),), table.get(((model.IP, None),)))
            g = (bound, (user, "")) if bound is not None else None
        else:
            g = model.governing(table, user, client_id)
        if len(self._governing) > 100000:
            self._governing.clear()
        self._governing[k] = g
        return g

    # -- recording -----------------------------------------------------------------------------
    def record(self, qtype: str, user: str, client_id: str, value: float, now_ms: int,
               check: bool = True) -> int:
        """Record ``value`` for the client; the throttle time in ms (0: within its quota, or no
        quota governs it). Kafka's recordAndGetThrottleTimeMs (``check=False``:
        recordNoThrottle)."""
        g = self.governing(qtype, user, client_id)
        if g is None:
            return 0
        bound, tags = g
        sensor = self.sensors.get((qtype, tags))
        if sensor is None:
            sensor = self.sensors[(qtype, tags)] = Sensor(bound)
        sensor.bound = bound
        num, size = self.num, self.size_ms
        sensor.rate.record(value, now_ms, num, size)
        self.dirty = True
        if not check:
            return 0
        rate, window = self.measure(qtype, tags, now_ms)
        if rate <= bound:
            return 0
        throttle = round((rate - bound) / bound * window)
        if qtype == REQUEST:
            throttle = min(throttle, size)
        return throttle

    def unrecord(self, qtype: str, user: str, client_id: str, value: float, now_ms: int) -> None:
        """Take ``value`` back (Kafka's unrecordQuotaSensor: a negative record into the current
        sample): a throttled fetch is answered without the bytes it recorded."""
        self.record(qtype, user, client_id, -value, now_ms, check=False)

    def mutation(self, user: str, client_id: str, permits: float, now_ms: int,
                 strict: bool) -> tuple[bool, int]:
        """KIP-599 (Kafka's ControllerMutationQuotaManager): ``permits`` partitions created or
        deleted by the client. (admitted, throttle ms). Strict (CreateTopics v6+,
        CreatePartitions v3+, DeleteTopics v5+): refused while the bucket is below zero
        (THROTTLING_QUOTA_EXCEEDED), else taken even past zero. Permissive (older versions):
        always taken; the throttle time only delays the client."""
        g = self.governing(MUTATION, user, client_id) if self.enabled[MUTATION] else None
        if g is None:
            return True, 0
        rate, tags = g
        burst = rate * self.num * self.size_ms / 1000.0
        b = self.buckets.get(tags)
        if b is None:
            b = self.buckets[tags] = TokenBucket(burst, now_ms)
        tokens = b.refill(rate, burst, now_ms)
        if strict and tokens < 0:
            return False, math.ceil(-tokens / rate * 1000)
        b.tokens -= permits
        return True, math.ceil(-b.tokens / rate * 1000) if b.tokens < 0 else 0

    def unmutate(self, user: str, client_id: str, permits: float) -> None:
        """Give back the tokens of a mutation that did not happen (the topic's creation failed)."""
        g = self.governing(MUTATION, user, client_id) if self.enabled[MUTATION] else None
        if g is not None and (b := self.buckets.get(g[1])) is not None:
            b.tokens += permits

    def measure(self, qtype: str, tags: Tags, now_ms: int) -> tuple[float, float]:
        """(rate per second over every frontend's samples, the window in ms)."""
        num, size = self.num, self.size_ms
        sensor = self.sensors.get((qtype, tags))
        total = 0.0
        oldest = None
        if sensor is not None:
            for start, value, _ in sensor.rate.live(now_ms, num, size):
                total += value
                if oldest is None or start < oldest:
                    oldest = start
        expire = now_ms - num * size
        for samples in self.others.get((qtype, tags), {}).values():
            for start, value in samples:
                if start > expire:
                    total += value
                    if oldest is None or start < oldest:
                        oldest = start
        window = window_ms(oldest, now_ms, num, size)
        return total * 1000.0 / window, window

    def throttled(self, qtype: str, user: str, client_id: str, throttle_ms: int,
                  now_ms: int) -> None:
        """A throttle was given (Kafka's throttleTimeSensor, for the throttle-time metric)."""
        g = self.governing(qtype, user, client_id)
        if g is None:
            return
        sensor = self.sensors.get((qtype, g[1]))
        if sensor is not None:
            sensor.throttle.record(throttle_ms, now_ms, self.num, self.size_ms)

    def connection(self, ip: str, now_ms: int) -> int:
        """KIP-612: a connection accepted from ``ip``; the ms to hold it before closing it when
        the address is over its connection_creation_rate, else 0."""
        if not self.enabled[CONNECTION]:
            return 0
        return self.record(CONNECTION, ip, "", 1.0, now_ms)

    # -- across frontends ----------------------------------------------------------------------
    def snapshot(self, now_ms: int) -> bytes:
        """What this frontend publishes: every live sensor's samples, rate and throttle times
        (the others sum the samples; the metrics collector the rates and throttle times).
        Sensors idle for a whole window are dropped (Kafka expires idle sensors too)."""
        num, size = self.num, self.size_ms
        out = []
        for key, sensor in list(self.sensors.items()):
            live = sensor.rate.live(now_ms, num, size)
            throttle = sensor.throttle.live(now_ms, num, size)
            if not live and not throttle:
                del self.sensors[key]
                continue
            qtype, (user, client_id) = key
            local = sum(v for _, v, _ in live)
            oldest = live[0][0] if live else None
            out.append((qtype, user, client_id, [(s, v) for s, v, _ in live],
                        local * 1000.0 / window_ms(oldest, now_ms, num, size),
                        sum(v for _, v, _ in throttle), sum(c for _, _, c in throttle),
                        sensor.bound))
        self.dirty = False
        return msgspec.msgpack.encode({"at": now_ms, "sensors": out})

    def merge(self, frontend: str, data: bytes | None) -> None:
        """Another frontend's last snapshot (None: it is gone)."""
        for per in self.others.values():
            per.pop(frontend, None)
        if data is None:
            return
        try:
            snap = msgspec.msgpack.decode(data)
        except msgspec.DecodeError:
            return
        for qtype, user, client_id, samples, *_ in snap.get("sensors", ()):
            self.others.setdefault((qtype, (user, client_id)), {})[frontend] = samples
        for key in [k for k, per in self.others.items() if not per]:
            del self.others[key]


def decode_snapshot(data: bytes) -> dict:
    return msgspec.msgpack.decode(data)
