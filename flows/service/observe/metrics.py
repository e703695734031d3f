"""Prometheus metrics of the service: what the instances decided and refused, and how fast.

The metrics live in ``prometheus_client``'s default registry (``REGISTRY``), with its
process and Python collectors, and are served by ``serve_metrics`` (``tsi run
--metrics-port``, or ``TSI_METRICS_PORT`` for ``python -m bytewax.run flows.service.main:flow``),
on every IPv4 interface unless ``--metrics-host`` / ``TSI_METRICS_HOST`` names another address.
Bytewax workers are threads of one process and share the metrics; each process of a
cluster serves its own (sum them in Prometheus).

| metric | type | labels | counts |
|---|---|---|---|
| ``tsi_decisions_total`` | counter | experiment | selections emitted, answers to retries included |
| ``tsi_served_total`` | counter | experiment, why | the same, by what served them (``why``) |
| ``tsi_context_other_total`` | counter | experiment, attribute | values not listed (``other``) |
| ``tsi_retries_total`` | counter | experiment | selections for a request_id already served |
| ``tsi_feedback_total`` | counter | experiment, outcome | feedback by outcome (below) |
| ``tsi_feedback_given_total`` | counter | experiment, field | by field: loss, or reward |
| ``tsi_dead_letters_total`` | counter | reason | every dead letter, upstream refusals included |
| ``tsi_pending_tickets`` | gauge | experiment | open tickets: selections awaiting feedback |
| ``tsi_early_feedback`` | gauge | experiment | feedback buffered, awaiting its request |
| ``tsi_instances`` | gauge | experiment | instances held (built on a first event, or restored) |
| ``tsi_instances_live`` | gauge | | of the process's instances, those built (active users) |
| ``tsi_instances_resting`` | gauge | | those resting as packed bytes (``observe.held``) |
| ``tsi_processing_seconds`` | histogram | kind | wall time of one event in the operator |
| ``tsi_event_age_seconds`` | histogram | kind | flow clock − event ``ts`` (Unix s), if it has one |
| ``tsi_last_event_timestamp_seconds`` | gauge | | Unix time the operator last handled an event |
| ``tsi_last_event_ts_seconds`` | gauge | | ``ts`` of the last handled event that had one |
| ``tsi_last_epoch_timestamp_seconds`` | gauge | | Unix time an input last closed an epoch |
| ``tsi_last_broker_contact_timestamp_seconds`` | gauge | | Unix time a broker was last reached |
| ``tsi_consumer_lag`` | gauge | topic, partition | high watermark − next offset to read |
| ``tsi_input_rebuilds_total`` | counter | topic, partition | consumers rebuilt: fetcher stopped |
| ``tsi_ready`` | gauge | | 1 while ``/ready`` answers 200, else 0 |
| ``tsi_shards_held`` | gauge | | shards this process's start restores (0: none named) |
| ``tsi_shards_restored`` | gauge | | of those, the shards restored so far |
| ``tsi_arm_selections_total`` | counter | experiment, arm | selections, retries not |
| ``tsi_arm_feedback_total`` | counter | experiment, arm | losses applied from feedback |
| ``tsi_arm_defaulted_total`` | counter | experiment, arm | default losses applied |
| ``tsi_arm_loss_sum`` | gauge | experiment, arm | sum of the applied losses, defaults too |
| ``tsi_arm_loss_squares_sum`` | gauge | experiment, arm | sum of their squares |
| ``tsi_arm_ips_loss_sum`` | gauge | experiment, arm | sum of loss / prob over them |
| ``tsi_arm_share`` | gauge | experiment, arm | q of a shared, context-free instance |
| ``tsi_arm_served_share`` | gauge | experiment, arm | its P: q under the allocation, as served |
| ``tsi_arm_context_share`` | gauge | experiment, context, arm | the same by context (below) |
| ``tsi_guardrail_samples_total`` | counter | experiment, metric, group | guardrail values sent |
| ``tsi_guardrail_sum`` | gauge | experiment, metric, group | their sum |
| ``tsi_guardrail_squares_sum`` | gauge | experiment, metric, group | the sum of their squares |

``kind`` is ``request`` or ``feedback``; ``why`` is ``bandit``, ``holdout``, ``burn_in`` or
``forced``. Outcomes of ``tsi_feedback_total``:

| outcome | the feedback ... |
|---|---|
| ``applied`` | updated the bandit (on arrival, or when the request it waited for came) |
| ``collected`` | was combined in its window (``aggregate``), applied once when it ends |
| ``defaulted`` | never came: its window ended and ``default_loss`` was applied |
| ``early`` | came before its request and waits: counted again once settled |
| ``duplicate`` | came for a request_id that has its feedback (applied or waiting) |
| ``arm_mismatch`` | names another arm than the one served |
| ``early_buffer_full`` | came before its request while the early-feedback buffer was full |
| ``unknown`` | waited ``feedback_ttl`` for its request in vain (``unknown_ticket``) |
| ``expired_ticket`` | never came: a ticket expired without it (``ticket_expired``) |
| ``late`` | came after its ticket expired, within the retry window (``late_feedback``) |

With an ``aggregate`` other than ``first``, each feedback of a window is ``collected`` and
the window's combined loss counts once as ``applied`` when the window ends.

By arm: ``flows.service.observe.arm_metrics`` (the mean loss and its interval, the IPS
estimate, when the q gauges are read and which experiments have them);
deploy/grafana/tsi-dashboard.json charts them all. Guardrails:
``flows.service.observe.guardrail_metrics`` (``group`` is what served the selection).

The metrics are told what happened, never peek: an instance returns a ``Handled`` for each
event (its outputs, and the open tickets, waiting feedback and applied feedback it gained
or lost), and the reasons of its dead letters name the rest. Dead letters are counted in
``build_flow``, where all of them merge on their way to the sink.

Cost: the per-event metrics are plain additions into a tally owned by the worker thread
(no lock, no ``.labels()`` lookup; ``prometheus_client``'s own counters and histograms
take a lock per update and cost several times more), summed over the threads by a
collector when Prometheus scrapes (``make bench-flow`` measures what they cost an event,
see bench/RESULTS.md). Metric updates never
raise into the flow: a failure is logged and skipped. Gauges count per process and
assume one dataflow per process (the service): a finished in-process test flow leaves
its open tickets counted.

Progress. The timestamps are 0 until the first occurrence. The two event gauges are the
latest over the worker threads: ``tsi_last_event_timestamp_seconds`` is the wall clock
(``time.time()``) when the operator finished an event, whatever the flow's clock (the
replays run on event time); ``tsi_last_event_ts_seconds`` is the event's own ``ts``, so
``tsi_last_event_timestamp_seconds - tsi_last_event_ts_seconds`` is how far behind the
producers the service runs. ``tsi_consumer_lag`` is ``high watermark − next offset`` per
input partition, as last observed (``observe_consumer_position``, ``observe_kafka_stats``);
it keeps its last value while the brokers are unreachable.

Readiness. ``serve_metrics`` also answers ``/healthz`` (200 while the process serves HTTP:
liveness) and ``/ready``: 200 when the service makes progress, 503 with a one-line reason
otherwise. Progress means both, within ``ready_timeout`` seconds (default 60):

- an input partition closed an epoch (``note_epoch_completed``, called from the source's
  snapshot: Bytewax takes one per epoch, recovery or not). Before the first epoch the
  service is not ready. ``ready_timeout`` must exceed the epoch interval
  (``--snapshot-every``) with a margin: 3 intervals or more.
- a Kafka broker was reached (``note_broker_contact(True)``: a delivery, a broker UP in the
  client statistics). Failures (``note_broker_contact(False, detail)``) only explain the
  503: a short outage does not make the service unready, one longer than ``ready_timeout``
  does.

And, once a start named the shards this process holds, every one of them is restored
(``observe.restoring.RESTORING``): until then the reason says "restoring: 37 of 128 shards".

The ``note_*`` functions are single attribute assignments (atomic under the GIL), cheap
enough for any thread to call at any rate. The state is ``READINESS``, one per process.
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from socketserver import ThreadingMixIn
from threading import get_ident
from time import time
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, Counter, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from flows.service.instances.instance import Early, Open
from flows.service.observe.arm_metrics import (
    ARM_DEFAULTED,
    ARM_FEEDBACK,
    ARM_IPS,
    ARM_LOSS,
    ARM_LOSS_SQUARES,
    ARM_SLOTS,
    Share,
    arm_families,
)
from flows.service.observe.guardrail_metrics import guardrail_families
from flows.service.observe.restoring import RESTORING, Restoring
from flows.service.observe.stream_clock import IDLE_AFTER, STREAM_CLOCK, Hold, StreamClock
from flows.service.wire.events import DeadLetter

__all__ = [
    "DEFAULT_HOST",
    "READINESS",
    "REGISTRY",
    "MetricsPortError",
    "Readiness",
    "count_context_other",
    "count_dead_letter",
    "note_broker_contact",
    "note_epoch_completed",
    "observe_consumer_position",
    "observe_expired",
    "observe_kafka_stats",
    "observe_restored",
    "serve_metrics",
]

log = logging.getLogger(__name__)

PROCESSING_BUCKETS = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,
)  # fmt: skip
AGE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
               3600.0)  # fmt: skip
KINDS = {True: "request", False: "feedback"}  # label of an event kind (is a request)
OUTCOMES = (
    "applied", "early", "duplicate", "arm_mismatch", "early_buffer_full", "unknown",
    "expired_ticket", "late", "collected", "defaulted",
)  # fmt: skip
# dead letters of an instance that are the fate of a feedback (or of a ticket)
FEEDBACK_REASONS = {
    "duplicate_feedback": "duplicate",
    "arm_mismatch": "arm_mismatch",
    "early_buffer_full": "early_buffer_full",
    "unknown_ticket": "unknown",
    "ticket_expired": "expired_ticket",
    "late_feedback": "late",
}

# slots of an experiment's tally (a list of numbers)
DECISIONS, RETRIES, PENDING, EARLY, INSTANCES, LOSSES, REWARDS = range(7)
FEEDBACK = {outcome: 7 + i for i, outcome in enumerate(OUTCOMES)}
_SLOTS = 7 + len(OUTCOMES)
APPLIED, EARLY_FEEDBACK = FEEDBACK["applied"], FEEDBACK["early"]
COLLECTED, DEFAULTED = FEEDBACK["collected"], FEEDBACK["defaulted"]
SLOT_OF_REASON = {reason: FEEDBACK[outcome] for reason, outcome in FEEDBACK_REASONS.items()}
# the gauge a dead letter of expiry (or of a registry change) lowers
_EXPIRY = {
    "ticket_expired": PENDING,
    "unknown_ticket": EARLY,
    "arm_retired": PENDING,
    "context_retired": PENDING,
}

DEAD_LETTERS = Counter("tsi_dead_letters", "Dead letters by reason.", ["reason"])
INPUT_REBUILDS = Counter(
    "tsi_input_rebuilds",
    "Input partition consumers rebuilt because their fetcher had stopped.",
    ["topic", "partition"],
)
CONTEXT_OTHER = Counter(
    "tsi_context_other",
    "Named-context requests whose value of an attribute was not listed (its other slot).",
    ["experiment", "attribute"],
)


class _Tally:
    """What one thread (a Bytewax worker) counted; only that thread writes it."""

    __slots__ = (
        "age", "arms", "experiments", "guardrails", "last_event", "last_ts", "processing",
        "served", "shares",
    )  # fmt: skip

    def __init__(self) -> None:
        self.last_event = 0.0  # time() when the last event was handled
        self.last_ts = 0.0  # the ts of the last event that had one
        self.experiments: dict[str, list[int]] = {}
        # (experiment, why) -> selections, for each why but "bandit" (decisions - these)
        self.served: dict[tuple[str, str], int] = {}
        # per kind (True: request): counts per bucket (the last is +Inf), then the sum
        self.processing = {k: [0] * (len(PROCESSING_BUCKETS) + 1) + [0.0] for k in (True, False)}
        self.age = {k: [0] * (len(AGE_BUCKETS) + 1) + [0.0] for k in (True, False)}
        self.arms: dict[tuple[str, str], list[float]] = {}  # (experiment, arm) -> ARM_SLOTS
        self.shares: dict[str, Share] = {}  # experiment -> its shared instance's q, last read
        # (experiment, metric, why) -> n, sum, sum of squares (``guardrail_metrics``)
        self.guardrails: dict[tuple[str, str, str], list[float]] = {}

    def experiment(self, name: str) -> list[int]:
        found = self.experiments.get(name)
        if found is None:
            found = self.experiments[name] = [0] * _SLOTS
        return found

    def arm(self, experiment: str, arm: str) -> list[float]:
        """The slots (``ARM_SLOTS``) of an arm of an experiment."""
        found = self.arms.get((experiment, arm))
        if found is None:
            found = self.arms[experiment, arm] = [0.0] * ARM_SLOTS
        return found


# One tally per OS thread (a Bytewax worker), kept after the thread ends. Keyed by the
# thread's id, not held in a threading.local: Bytewax enters Python from its Rust threads
# with a fresh Python thread state now and then, and each would get a new local.
_tallies: dict[int, _Tally] = {}
_tallies_lock = threading.Lock()


def thread_tally() -> _Tally:
    """The tally of the calling thread (the shard's event loop adds to it what each
    event did, see ``flows.service.shards._event_loop``)."""
    return _tallies.get(get_ident()) or _mine()


def _mine() -> _Tally:
    tally = _tallies.get(get_ident())
    if tally is None:
        with _tallies_lock:
            tally = _tallies.setdefault(get_ident(), _Tally())
    return tally


def _failed(what: str) -> None:
    log.warning("metrics: %s failed", what, exc_info=True)


def observe_expired(instance: Any, out: list) -> None:
    """Account for what ``Instance.expire`` (or a registry change) returned: expired or
    retired tickets and unknown feedback, and the windows it closed applying their
    feedback or the default loss (``Instance.take_closed``)."""
    try:
        applied, defaulted = instance.take_closed()
        if not out and not applied and not defaulted:
            return
        tally = _mine()
        c = tally.experiment(instance.experiment.name)
        if applied or defaulted:
            _count_losses(tally, instance.experiment, instance.take_closed_losses())
        c[PENDING] -= applied + defaulted
        c[APPLIED] += applied
        c[DEFAULTED] += defaulted
        for item in out:
            gauge = _EXPIRY.get(item.reason)
            if gauge is not None:
                c[gauge] -= 1
                slot = SLOT_OF_REASON.get(item.reason)
                if slot is not None:
                    c[slot] += 1
    except Exception:
        _failed("observe_expired")


def _count_losses(tally: _Tally, experiment: Any, closed: list) -> None:
    """Count by arm the losses applied as windows closed: (arm, loss, prob, defaulted)."""
    for arm, loss, prob, defaulted in closed:
        slots = tally.arm(experiment.name, experiment.arms[arm])
        slots[ARM_DEFAULTED if defaulted else ARM_FEEDBACK] += 1
        slots[ARM_LOSS] += loss
        slots[ARM_LOSS_SQUARES] += loss * loss
        slots[ARM_IPS] += loss / prob


def observe_restored(experiment: str, instance: Any = None, pending: int = 0) -> None:
    """Account for an instance restored from a snapshot, with the open tickets and waiting
    feedback of ``instance`` (None: an instance not built yet, holding ``pending`` open
    tickets)."""
    try:
        c = _mine().experiment(experiment)
        c[INSTANCES] += 1
        c[PENDING] += pending
        if instance is not None:
            c[PENDING] += len(instance.entries(Open))
            c[EARLY] += len(instance.entries(Early))
    except Exception:
        _failed("observe_restored")


def count_context_other(experiment: str, attributes: tuple[str, ...]) -> None:
    """Count a request whose named context put ``attributes`` in their ``other`` slot."""
    try:
        for attribute in attributes:
            CONTEXT_OTHER.labels(experiment, attribute).inc()
    except Exception:
        _failed("count_context_other")


_by_reason: dict[str, Any] = {}


def count_dead_letter(letter: DeadLetter) -> DeadLetter:
    """Count one dead letter by reason; returns it unchanged."""
    try:
        child = _by_reason.get(letter.reason)
        if child is None:  # a race builds it twice: the same child, harmless
            child = _by_reason[letter.reason] = DEAD_LETTERS.labels(letter.reason)
        child.inc()
    except Exception:
        _failed("count_dead_letter")
    return letter


class _MetricsCollector:
    """Sums the threads' tallies into metric families when Prometheus scrapes."""

    def describe(self) -> list[Metric]:
        return list(self._families({}, {}, {}, {}))

    def collect(self) -> Iterator[Metric]:
        with _tallies_lock:
            tallies = list(_tallies.values())
        experiments: dict[str, list[int]] = {}
        served: dict[tuple[str, str], int] = {}
        processing = {k: [0] * (len(PROCESSING_BUCKETS) + 2) for k in (True, False)}
        age = {k: [0] * (len(AGE_BUCKETS) + 2) for k in (True, False)}
        for tally in tallies:
            for name, counts in list(tally.experiments.items()):
                total = experiments.setdefault(name, [0] * _SLOTS)
                for i, n in enumerate(list(counts)):
                    total[i] += n
            for labels, n in list(tally.served.items()):
                served[labels] = served.get(labels, 0) + n
            for mine, total in ((tally.processing, processing), (tally.age, age)):
                for kind in (True, False):
                    for i, n in enumerate(list(mine[kind])):
                        total[kind][i] += n
        return self._families(experiments, served, processing, age)

    @staticmethod
    def _families(
        experiments: dict[str, list[int]], served: dict, processing: dict, age: dict
    ) -> Iterator[Metric]:
        def family(kind: type, name: str, doc: str, slot: int) -> Metric:
            metric = kind(name, doc, labels=["experiment"])
            for experiment, counts in sorted(experiments.items()):
                metric.add_metric([experiment], counts[slot])
            return metric

        yield family(CounterMetricFamily, "tsi_decisions",
                     "Selections emitted, answers to retries included.", DECISIONS)  # fmt: skip
        by_why = CounterMetricFamily(
            "tsi_served", "Selections emitted by what served them.", labels=["experiment", "why"]
        )
        by_bandit = {name: counts[DECISIONS] for name, counts in experiments.items()}
        for (experiment, _), n in served.items():
            by_bandit[experiment] = by_bandit.get(experiment, 0) - n
        for experiment, why, n in sorted(
            [(e, "bandit", n) for e, n in by_bandit.items()]
            + [(e, w, n) for (e, w), n in served.items()]
        ):
            by_why.add_metric([experiment, why], n)
        yield by_why
        yield family(CounterMetricFamily, "tsi_retries",
                     "Selections answering a request_id already served.", RETRIES)  # fmt: skip
        yield from _feedback_families(experiments)
        yield family(GaugeMetricFamily, "tsi_pending_tickets",
                     "Open tickets waiting for their feedback.", PENDING)  # fmt: skip
        yield family(GaugeMetricFamily, "tsi_early_feedback",
                     "Feedback waiting for its request.", EARLY)  # fmt: skip
        yield family(GaugeMetricFamily, "tsi_instances",
                     "Instances held by this process.", INSTANCES)  # fmt: skip
        for name, doc, bounds, totals in (
            ("tsi_processing_seconds", "Wall time of one event in the stateful operator.",
             PROCESSING_BUCKETS, processing),
            ("tsi_event_age_seconds", "Clock of the flow minus the ts of the event.",
             AGE_BUCKETS, age),
        ):  # fmt: skip
            metric = HistogramMetricFamily(name, doc, labels=["kind"])
            for kind in (True, False) if totals else ():
                counts, cumulative, buckets = totals[kind], 0, []
                for bound, n in zip((*bounds, float("inf")), counts, strict=False):
                    cumulative += n
                    buckets.append((floatToGoString(bound), cumulative))
                metric.add_metric([KINDS[kind]], buckets, counts[-1])
            yield metric


def _feedback_families(experiments: dict[str, list[int]]) -> Iterator[Metric]:
    """Feedback by outcome, and by the field it came in (loss or reward)."""
    feedback = CounterMetricFamily(
        "tsi_feedback", "Feedback by outcome (see flows.service.observe.metrics).",
        labels=["experiment", "outcome"],
    )  # fmt: skip
    for experiment, counts in sorted(experiments.items()):
        for outcome, slot in FEEDBACK.items():
            feedback.add_metric([experiment, outcome], counts[slot])
    yield feedback
    given = CounterMetricFamily(
        "tsi_feedback_given", "Feedback that reached its instance, by its field: "
        "loss, or reward (applied as loss = -reward).", labels=["experiment", "field"],
    )  # fmt: skip
    for experiment, counts in sorted(experiments.items()):
        given.add_metric([experiment, "loss"], counts[LOSSES])
        given.add_metric([experiment, "reward"], counts[REWARDS])
    yield given


REGISTRY.register(_MetricsCollector())


# ----------------------------------------------------------------------- progress, readiness


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ago(now: float, then: float) -> str:
    return f"{max(0.0, now - then):.0f} s"


class Readiness:
    """Whether the service makes progress: an epoch and a broker contact, each within
    ``timeout`` seconds, and (with ``restoring``) every shard it holds restored. The
    ``note_*`` methods are plain assignments; ``status`` reads.

    >>> r = Readiness(timeout=60.0, clock=lambda: 1000.0)
    >>> r.status(1010.0)
    (False, 'no epoch completed yet, started 10 s ago; no Kafka broker reached yet')
    >>> r.note_epoch(1005.0)
    >>> r.note_broker(True, now=1006.0)
    >>> r.status(1010.0)
    (True, 'last epoch 5 s ago, Kafka broker reached 4 s ago')
    >>> r.note_broker(False, "1/1 brokers are down", now=1020.0)
    >>> r.status(1070.0)  # doctest: +NORMALIZE_WHITESPACE
    (False, 'no epoch for 65 s (ready timeout 60 s); no Kafka broker reached for 64 s,
     last error 50 s ago: 1/1 brokers are down')
    """

    def __init__(
        self,
        timeout: float = 60.0,
        clock: Callable[[], float] = time,
        stream: StreamClock | None = None,
        restoring: Restoring | None = None,
    ) -> None:
        self.timeout = timeout
        self.clock = clock
        self.stream = stream  # expiry held back longer than the timeout: not ready
        self.restoring = restoring  # a held shard not restored yet: not ready
        self.started = clock()
        self.last_epoch: float | None = None
        self.last_contact: float | None = None
        self.last_error: tuple[float, str] | None = None  # (when, what)
        self._was_ready: bool | None = None

    def note_epoch(self, now: float | None = None) -> None:
        """An input partition closed an epoch (at ``now``, default the clock)."""
        self.last_epoch = self.clock() if now is None else now

    def note_broker(self, ok: bool, detail: str = "", now: float | None = None) -> None:
        """A broker answered (``ok``), or a client reported ``detail`` as an error."""
        if ok:
            self.last_contact = self.clock() if now is None else now
        else:
            self.last_error = (self.clock() if now is None else now, detail)

    def _epoch_problem(self, now: float, last: float | None) -> str | None:
        if last is None:
            return f"no epoch completed yet, started {_ago(now, self.started)} ago"
        if now - last > self.timeout:
            return f"no epoch for {_ago(now, last)} (ready timeout {self.timeout:g} s)"
        return None

    def _broker_problem(
        self, now: float, contact: float | None, error: tuple[float, str] | None
    ) -> str | None:
        if contact is not None and now - contact <= self.timeout:
            return None
        problem = (
            "no Kafka broker reached yet"
            if contact is None
            else f"no Kafka broker reached for {_ago(now, contact)}"
        )
        if error is not None and (contact is None or error[0] >= contact):
            problem += f", last error {_ago(now, error[0])} ago: {_one_line(error[1])}"
        return problem

    def _expiry_problem(self, now: float, hold: Hold | None) -> str | None:
        if hold is None or now - hold.still_since <= self.timeout:
            return None
        return (
            f"{hold.describe()}: stream time still for {_ago(now, hold.still_since)}, no "
            "ticket expires (see tsi_expiry_held_back)"
        )

    def status(self, now: float | None = None) -> tuple[bool, str]:
        """(ready, reason): the reason is one line, naming every problem when not ready."""
        now = self.clock() if now is None else now
        epoch, contact, error = self.last_epoch, self.last_contact, self.last_error
        hold = None if self.stream is None else self.stream.holding()
        problems = (
            None if self.restoring is None else self.restoring.problem(),
            self._epoch_problem(now, epoch),
            self._broker_problem(now, contact, error),
            self._expiry_problem(now, hold),
        )
        reason = "; ".join(p for p in problems if p)
        ready = not reason and epoch is not None and contact is not None
        if ready:
            reason = (
                f"last epoch {_ago(now, epoch)} ago, Kafka broker reached {_ago(now, contact)} ago"
            )
            if hold is not None:
                reason += f"; {hold.describe()} for {_ago(now, hold.still_since)}"
        if ready is not self._was_ready:
            self._was_ready = ready
            report = log.info if ready else log.warning
            report("%s: %s", "ready" if ready else "not ready", reason)
        return ready, reason


#: the process's readiness, fed by the note_* functions below
READINESS = Readiness(stream=STREAM_CLOCK, restoring=RESTORING)


def note_epoch_completed(now: float | None = None) -> None:
    """Call when an input partition closes an epoch (its ``snapshot``); any thread, any rate.

    Example, in a source partition: ``def snapshot(self): note_epoch_completed(); ...``
    """
    READINESS.note_epoch(now)


def note_broker_contact(ok: bool, detail: str = "", now: float | None = None) -> None:
    """Call when a broker answered (``ok``: a delivery acknowledged), or with the error
    (``detail``) a Kafka client reported. Any thread, any rate.

    Example: ``{"error_cb": lambda err: note_broker_contact(False, str(err))}`` in a client
    configuration, ``note_broker_contact(True)`` after a batch was acknowledged.
    """
    READINESS.note_broker(ok, detail, now)


_lag: dict[tuple[str, int], int] = {}  # (topic, partition): messages behind


def observe_consumer_position(
    topic: str, partition: int, next_offset: int, high_watermark: int
) -> None:
    """Set ``tsi_consumer_lag{topic,partition}`` to ``high_watermark - next_offset``.

    Negative offsets (librdkafka's logical ones: beginning, invalid, ...) are unknown: the
    gauge keeps its last value. Never raises.

    Example: ``observe_consumer_position("tsi.requests", 0, 90, 100)`` sets the lag to 10.
    """
    try:
        if next_offset >= 0 and high_watermark >= 0:
            _lag[(topic, int(partition))] = max(0, high_watermark - next_offset)
    except Exception:
        _failed("observe_consumer_position")


_CONNECTED = {"UP", "UPDATE"}  # librdkafka broker states with a working connection
_REAL_BROKERS = {"configured", "learned"}  # not "logical" (GroupCoordinator), "internal"


def observe_kafka_stats(
    stats: str | bytes | Mapping[str, Any],
    next_offset: int | None = None,
    now: float | None = None,
) -> None:
    """Feed readiness and lag from librdkafka statistics (a consumer's ``stats_cb``).

    A broker ``UP`` is a contact; none up is a failure naming the brokers' states. Each
    partition the application assigned (``desired``) gets its lag: the last stable offset
    (else the high watermark) minus ``next_offset``, the flow's position, when the client
    reads that one partition (Bytewax builds one consumer per partition), else minus the
    client's ``app_offset``. Never raises.

    Example, in a Bytewax Kafka source partition (``self._offset``: the next offset)::

        def _process_stats(self, json_stats: str) -> None:
            observe_kafka_stats(json_stats, self._offset)
    """
    try:
        doc = json.loads(stats) if isinstance(stats, str | bytes) else stats
        _observe_brokers(doc.get("brokers") or {}, now)
        assigned = [
            (topic, int(pid), p)
            for topic, t in (doc.get("topics") or {}).items()
            for pid, p in (t.get("partitions") or {}).items()
            if int(pid) >= 0 and p.get("desired")
        ]
        for topic, partition, p in assigned:
            position = p.get("app_offset", -1)
            if next_offset is not None and next_offset >= 0 and len(assigned) == 1:
                position = next_offset
            end = p.get("ls_offset", -1)
            end = end if end >= 0 else p.get("hi_offset", -1)
            observe_consumer_position(topic, partition, position, end)
    except Exception:
        _failed("observe_kafka_stats")


def _observe_brokers(brokers: Mapping[str, Any], now: float | None) -> None:
    real = [b for b in brokers.values() if b.get("source") in _REAL_BROKERS]
    if any(b.get("state") in _CONNECTED for b in real):
        note_broker_contact(True, now=now)
    elif real:
        states = ", ".join(f"{b.get('name', '?')} {b.get('state', '?')}" for b in real)
        note_broker_contact(False, f"no Kafka broker up ({states})", now)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


class _ProgressCollector:
    """The progress gauges and ``tsi_ready``, read when Prometheus scrapes."""

    def describe(self) -> list[Metric]:
        return list(self._families(False, 0.0, 0.0, {}, None))

    def collect(self) -> Iterator[Metric]:
        with _tallies_lock:
            tallies = list(_tallies.values())
        last_event = max((t.last_event for t in tallies), default=0.0)
        last_ts = max((t.last_ts for t in tallies), default=0.0)
        ready, _ = READINESS.status()
        hold = STREAM_CLOCK.holding()
        return self._families(ready, last_event, last_ts, dict(_lag), hold)

    @staticmethod
    def _families(
        ready: bool,
        last_event: float,
        last_ts: float,
        lag: dict[tuple[str, int], int],
        hold: Hold | None,
    ) -> Iterable[Metric]:
        state = READINESS
        yield _gauge("tsi_ready", "1 while /ready answers 200 (progress), else 0.", ready)
        yield _gauge("tsi_last_event_timestamp_seconds",
                     "Unix time the operator last handled an event.", last_event)  # fmt: skip
        yield _gauge("tsi_last_event_ts_seconds",
                     "The ts (Unix s) of the last event handled with one.", last_ts)  # fmt: skip
        yield _gauge("tsi_last_epoch_timestamp_seconds",
                     "Unix time an input partition last closed an epoch.",
                     state.last_epoch or 0.0)  # fmt: skip
        yield _gauge("tsi_last_broker_contact_timestamp_seconds",
                     "Unix time a Kafka broker was last reached.",
                     state.last_contact or 0.0)  # fmt: skip
        restored, held = RESTORING.counts() or (0, 0)
        yield _gauge("tsi_shards_held", "Shards this process's start restores.", held)
        yield _gauge("tsi_shards_restored", "Of those, the shards restored so far.", restored)
        metric = GaugeMetricFamily(
            "tsi_consumer_lag", "Messages from the next offset the flow reads to the end.",
            labels=["topic", "partition"],
        )  # fmt: skip
        for (topic, partition), behind in sorted(lag.items()):
            metric.add_metric([topic, str(partition)], behind)
        yield metric
        yield _gauge("tsi_expiry_delay_seconds",
                     "How far the stream time that tickets expire on is behind the wall clock "
                     "(+Inf: nothing can expire yet).",
                     0.0 if hold is None else time() - hold.stream_time)  # fmt: skip
        held = GaugeMetricFamily(
            "tsi_expiry_held_back",
            "1 for each input partition holding expiry back: 'behind' (messages left to "
            f"read) or 'no position' (end not known yet; idle after {IDLE_AFTER:g} s).",
            labels=["topic", "partition", "position"],
        )
        for topic, partition, position in () if hold is None else hold.partitions:
            held.add_metric([topic, str(partition), position], 1.0)
        yield held


REGISTRY.register(_ProgressCollector())


class _TallyCollector:
    """The metrics ``families`` makes of the threads' tallies (by arm: ``arm_metrics``; by
    guardrail: ``guardrail_metrics``)."""

    def __init__(self, families: Callable[[Iterable[Any]], Iterator[Metric]]) -> None:
        self.families = families

    def describe(self) -> list[Metric]:
        return list(self.families(()))

    def collect(self) -> Iterator[Metric]:
        with _tallies_lock:
            tallies = list(_tallies.values())
        return self.families(tallies)


REGISTRY.register(_TallyCollector(arm_families))
REGISTRY.register(_TallyCollector(guardrail_families))


# ------------------------------------------------------------------------------ HTTP server


#: The metrics server's address when none is given: every IPv4 interface, so that probes
#: and scrapers reach it on a container's or pod's own address (``--metrics-host``).
DEFAULT_HOST = "0.0.0.0"
_HOST_HINT = (
    "give one with --metrics-host / TSI_METRICS_HOST: 0.0.0.0 (every IPv4 interface), "
    "127.0.0.1 (this machine only), :: (IPv6) or an address of this machine"
)


class MetricsPortError(OSError):
    """The metrics port or host cannot be bound: said in one line, naming what to change."""

    @classmethod
    def of(cls, addr: str, port: int, exc: OSError) -> MetricsPortError:
        where = f"{addr}:{port}: {_one_line(exc)}"
        hint = "choose another with --metrics-port / TSI_METRICS_PORT"
        if exc.errno == errno.EADDRINUSE:
            error = cls(f"metrics port {port} is already in use ({where}); {hint}")
        elif isinstance(exc, socket.gaierror):
            error = cls(f"metrics host {addr!r} is not a known address ({where}); {_HOST_HINT}")
        elif exc.errno == errno.EADDRNOTAVAIL:
            error = cls(
                f"metrics host {addr!r} is not an address of this machine ({where}); {_HOST_HINT}"
            )
        else:
            error = cls(f"cannot serve metrics on port {port} ({where}); {hint}")
        error.errno = exc.errno
        return error


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow client never holds the process


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds would flood the log."""


def _text() -> list[tuple[str, str]]:
    """Headers of a text answer: a new list each time, as wsgiref appends Content-Length."""
    return [("Content-Type", "text/plain; charset=utf-8")]


def metrics_app(readiness: Readiness | None = None) -> Callable:
    """The WSGI app: ``/ready``, ``/healthz``, and the metrics on every other path (as
    ``prometheus_client`` does). ``readiness`` defaults to ``READINESS``."""
    prometheus = make_wsgi_app(REGISTRY)

    def app(environ: dict[str, Any], start_response: Callable) -> list[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            start_response("200 OK", _text())
            return [b"alive\n"]
        if path == "/ready":
            ready, reason = (READINESS if readiness is None else readiness).status()
            status = "200 OK" if ready else "503 Service Unavailable"
            start_response(status, _text())
            return [f"{'ready' if ready else 'not ready'}: {reason}\n".encode()]
        return prometheus(environ, start_response)

    return app


def _bind(addr: str, port: int, app: Callable) -> WSGIServer:
    """An HTTP server on (addr, port), IPv4 or IPv6 as ``addr`` is."""
    info = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = info[0]
    server_class = type("_TsiServer", (_Server,), {"address_family": family})
    return make_server(sockaddr[0], port, app, server_class, handler_class=_QuietHandler)


_servers: dict[tuple[str, int], tuple[WSGIServer, threading.Thread]] = {}
_servers_lock = threading.Lock()


def serve_metrics(
    port: int,
    addr: str = DEFAULT_HOST,
    ready_timeout: float = 60.0,
    *,
    readiness: Readiness | None = None,
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``/metrics``, ``/ready`` and ``/healthz`` on ``addr`` (a host name or an IPv4
    or IPv6 address of this machine) from a daemon thread; returns (server, thread).
    Raises ``MetricsPortError`` (one line) when the host or port cannot be bound.

    ``ready_timeout`` (seconds) is set on ``readiness`` (default ``READINESS``). Port 0
    picks a free port (``server.server_port``). Asking again for a port this process
    already serves returns that server instead of failing.

    >>> server, _ = serve_metrics(0, "127.0.0.1")
    >>> server.server_port > 0
    True
    >>> server.shutdown(); server.server_close()
    """
    if not ready_timeout > 0:
        msg = f"ready_timeout must be positive, got {ready_timeout!r}"
        raise ValueError(msg)
    state = READINESS if readiness is None else readiness
    state.timeout = float(ready_timeout)
    if not addr or addr != addr.strip():
        raise MetricsPortError(f"metrics host {addr!r} is not a host name or address; {_HOST_HINT}")
    with _servers_lock:
        if port and (addr, port) in _servers:
            return _servers[(addr, port)]
        try:
            server = _bind(addr, port, metrics_app(readiness))
        except OSError as exc:
            raise MetricsPortError.of(addr, port, exc) from None
        thread = threading.Thread(
            target=server.serve_forever, name=f"tsi-metrics-{server.server_port}", daemon=True
        )
        thread.start()
        _servers[(addr, server.server_port)] = (server, thread)
        log.info("metrics on http://%s:%d/metrics (/ready, /healthz)", addr, server.server_port)
        return server, thread
