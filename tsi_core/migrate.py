"""Carry a bandit's learned state over to a changed experiment: arms, class or γ.

``migrate(bandit, arm_map, ...)`` builds a new bandit; the old
one is left unchanged. ``arm_map`` has one entry per NEW arm: the OLD arm index it
continues, or None for a new arm; old arms not named are retired.

* The statistics ψ, V, D, ``n_updates`` and ``n_rounds`` carry over unchanged: they belong
  to the loss stream, not to the class. A new ``variant`` with another baseline converts
  it: the running minimum becomes the mean so far and the other way round (the loss
  history itself is not kept, so this is the one value it can carry).
* Same state layout (Fixed/Contextual with the same number of contexts, Switching with any
  rate, the same Markov class with an identity map), whatever γ: each kept arm keeps its
  state exactly, bit for bit (for CumulativeLoss a changed γ therefore changes p: the loss
  history is what is kept). A retired arm's state is dropped, its mass renormalised away.
  A new arm gets the mean log-weight of the kept arms (the mean Φ per context; the
  geometric mean weight for Switching), or with ``new_arm_share=s`` the weight that makes
  its p (before ε-mixing) s in every context. Switching weights are not re-normalised:
  they are defined up to a common factor and the next update normalises them.
* Otherwise (another class kind, another number of contexts, any Markov change) the new
  state is built so that p per context, after the arm map, equals the old one: kept arms
  keep their relative p, new arms enter as above (geometric mean p or share s). Contexts
  are matched by index when both classes are contextual; a context the old class did not
  have, or a non-contextual new class, gets the mean p over the old contexts. CumulativeLoss
  gets Φ/D = -log p / c (c = γ/sqrt(V/D² + 1), the new η·D; a p of 0 becomes the smallest
  float), Switching p, Markov each arm's p spread over its classes by their initial
  prior (an arm with no class loses its mass).
* Before any positive φ (D = 0) a CumulativeLoss state has no unit: it is all 0 (uniform p)
  and ``new_arm_share`` cannot apply. The first positive φ resets every class's weights
  anyway (η_0 = ∞).
* A context where no arm keeps any weight, or a map with no kept arm, restarts from the new
  class's initial state (the statistics are still carried).
* A change of learner (``Variant.learner``: exponential weights and the Tsallis learner of
  ``bobw`` read V, D and the state differently) keeps p per context as above, the baseline
  and the counters. Into the Tsallis learner: S = 0 and every context's clock 0, D = 0 (the
  next non-zero gap sets it) and Φ/D = (2/sqrt(p) - 2/sqrt(max p))/η̃ (η̃ the context's),
  which gives p back. Out of it: V/D² = 0, D kept (the RMS of the gaps: the growth bound
  takes it from there) and Φ/D = -log p/c as above. Within the Tsallis learner any change
  but none (same class, identity map) is made the same way, S, D, the context clocks and
  the context means kept (by context index; a context the old class lacked gets the clock
  its S gives, ``Kernel.clocks_from_total``, and the mean ψ with a count of 0, which its
  next loss replaces), and each kept arm's gap statistics (rescaled so that D is still
  the root of their mean; a new arm joins at its first gap): p per context follows the
  rules above (new arms: geometric mean p, or ``new_arm_share``), since the Tsallis p is
  not a per-arm function of Φ.

The new bandit has the plain allocation (``tsi_core.allocation``): an allocation names arms
by index, and the indices change; the caller sets it for the new arms. Tickets keep their
``why``.

Pending tickets follow the arm map (``Migration.tickets``, by round): a ticket of a retired
arm, or of a context the new class does not have, is no longer pending (None); a context
becomes None when the new class has none. ``Migration.remap`` does the same for settled
tickets kept for retries.

>>> from tsi_core import Bandit, Switching
>>> b = Bandit(3, instance_id="u")
>>> for arm, loss in [(0, 1.0), (1, 3.0), (2, 2.0)]:
...     b.update(b.select(u=arm / 3 + 0.1), loss)
>>> waiting = b.select(u=0.99)
>>> m = migrate(b, [2, 0, None])                # keep arms 2, 0; retire 1; append one
>>> m.bandit.n_arms, m.tickets[4].arm, m.bandit.n_updates == b.n_updates
(3, 0, True)
>>> s = migrate(b, [0, 1, 2], competition=Switching(rate=0.01)).bandit
>>> bool(abs(s.weight_shares() - b.weight_shares()).max() < 1e-9)  # p kept (q: its ε-mixing)
True
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tsi_core._kernel import HEAD, exp_array, log_array, log_sum_exp, sum_last
from tsi_core._kernel import log as kernel_log
from tsi_core.bandit import Bandit, TicketError, configure
from tsi_core.structures import CumulativeLoss, Structure, Transform
from tsi_core.ticket import Ticket
from tsi_core.validate import check_int, check_real


@dataclass(frozen=True)
class Migration:
    """The migrated bandit and, by round, each old pending ticket remapped (None: dropped).

    ``new_index_of_old`` maps each kept old arm to its new index.
    """

    bandit: Bandit
    tickets: dict[int, Ticket | None]
    new_index_of_old: dict[int, int]
    old_instance: str

    def remap(self, ticket: Ticket) -> Ticket | None:
        """A ticket of the old instance as the new one would have issued it, or None."""
        if not isinstance(ticket, Ticket) or ticket.instance != self.old_instance:
            raise TicketError(f"not a ticket of instance {self.old_instance!r}: {ticket!r}")
        return _moved(ticket, self.new_index_of_old, self.bandit)


def _moved(ticket: Ticket, arms: dict[int, int], new: Bandit) -> Ticket | None:
    moved = remap_ticket(ticket, arms)
    n_contexts = new.structure.n_contexts
    if n_contexts == 1:
        context = None
    elif ticket.context is not None and ticket.context < n_contexts:
        context = ticket.context
    else:
        return None  # a context the new class does not have: its loss has no place
    return None if moved is None else moved._replace(instance=new.instance_id, context=context)


def remap_ticket(
    ticket: Ticket, new_index_of_old: Mapping[int, int | None] | Sequence[int | None]
) -> Ticket | None:
    """The ticket with its arm renumbered, or None if its arm is retired.

    ``new_index_of_old``: old arm -> new arm, as a dict (a missing arm is retired) or a
    list with one entry per old arm (None: retired).

    >>> remap_ticket(Ticket("u", 7, arm=2, prob=0.5, weight_share=0.4), [None, 0, 1]).arm
    1
    """
    if not isinstance(ticket, Ticket):
        raise ValueError(f"expected a Ticket, got {ticket!r}")
    if isinstance(new_index_of_old, Mapping):
        new = new_index_of_old.get(ticket.arm)
    elif 0 <= ticket.arm < len(new_index_of_old):
        new = new_index_of_old[ticket.arm]
    else:
        raise ValueError(f"ticket arm {ticket.arm} is outside a map of {len(new_index_of_old)}")
    return None if new is None else ticket._replace(arm=check_int("new arm", new, 0))


def migrate(
    bandit: Bandit,
    arm_map: Sequence[int | None],
    n_arms: int | None = None,
    competition: Any = None,
    gamma: float | None = None,
    new_arm_share: float | None = None,
    instance_id: str | None = None,
    variant: Any = None,
) -> Migration:
    """A new bandit continuing ``bandit`` under a changed configuration (see the module).

    ``competition``, ``gamma`` and ``variant`` default to the old ones; ``gamma`` None
    with a changed competition is the new class's default sqrt(W). ``n_arms``, if given, must equal
    ``len(arm_map)``; ``instance_id`` defaults to the old one (remapped tickets carry the
    new one). The seed and generator state are copied. Invalid arguments raise
    ``ValueError`` naming the bad value.
    """
    sources = _check_arm_map(arm_map, bandit.n_arms)
    if n_arms is not None and check_int("n_arms", n_arms, 1) != len(sources):
        raise ValueError(f"n_arms must equal len(arm_map) = {len(sources)}, got {n_arms!r}")
    kept = [i for i, s in enumerate(sources) if s is not None]
    fresh = [i for i, s in enumerate(sources) if s is None]
    share = _check_share(new_arm_share, len(fresh), len(kept))
    same_class = competition is None or (
        hasattr(competition, "to_dict") and competition.to_dict() == bandit.competition.to_dict()
    )
    if gamma is None and same_class:
        gamma = bandit.gamma
    competition = bandit.competition if competition is None else competition
    variant = bandit.variant if variant is None else variant
    m, competition, new_s, gamma, variant = configure(
        len(sources), competition, gamma, None, variant
    )
    new_id = bandit.instance_id if instance_id is None else instance_id
    new = Bandit(m, competition, gamma, instance_id=new_id, variant=variant)
    old_k, new_k = bandit._table.kernel, new._table.kernel
    unchanged = same_class and sources == list(range(bandit.n_arms))
    if (old_k.tsallis or new_k.tsallis) and not (old_k.tsallis and new_k.tsallis and unchanged):
        new._row[:HEAD] = bandit._row[:HEAD]
        new._state = _across_learners(bandit, new, sources, share)
    else:
        c_new = new_k.scale(bandit._vn)  # η·D of the new bandit
        new._state = _new_state(bandit, new_s, c_new, sources, share, same_class)
        new._row[:HEAD] = bandit._row[:HEAD]  # ψ, V/D², D, the counters: the loss stream's
        new._clocks = bandit._clocks  # the same layout here (none, or the same contexts)
        new._context_means = bandit._context_means
        new._arm_stats = bandit._arm_stats
    new.psi = _baseline_state(bandit, variant.baseline)
    new._seed = bandit._seed
    rng = bandit._rng_obj.bit_generator.state if bandit._rng_obj is not None else bandit._rng_state
    new._rng_state = copy.deepcopy(rng)
    arms = {s: i for i, s in enumerate(sources) if s is not None}
    tickets = {t.round: _moved(t, arms, new) for t in sorted(bandit.pending, key=lambda t: t.round)}
    for moved in tickets.values():
        if moved is not None:
            new._hold(moved)
    return Migration(new, tickets, arms, bandit.instance_id)


def _baseline_state(bandit: Bandit, baseline: str) -> float:
    """The ψ column for ``baseline``: the running minimum and the running mean stand for
    each other (before any loss: +inf for the minimum, 0 for the mean, which is unused)."""
    if bandit.n_updates or baseline == bandit.variant.baseline:
        return bandit.psi
    return math.inf if baseline == "min" else 0.0


def _new_state(
    bandit: Bandit,
    new_s: Structure,
    c_new: float,
    sources: list[int | None],
    share: float | None,
    same_class: bool,
) -> np.ndarray:
    """The new class's state continuing ``bandit``'s (the rules: see the module); ``c_new``
    is the new bandit's η·D."""
    old_s = bandit.structure
    logs = new_s.per_arm_log(c_new)  # None: no per-arm state
    per_arm = type(old_s) is type(new_s) and old_s.n_contexts == new_s.n_contexts
    if all(s is None for s in sources) or (
        isinstance(new_s, CumulativeLoss) and not bandit._d_mant
    ):
        return new_s.initial_state()
    if per_arm and logs is not None:
        state = _carry(bandit._state, sources, *logs, share)
        return state if np.isfinite(logs[0](state)).any() else new_s.initial_state()
    if same_class and sources == list(range(bandit.n_arms)):
        return bandit._state.copy()
    c_old = bandit._table.kernel.scale(bandit._vn)
    old_log_p = _log_normalise(old_s.log_weights_one(bandit._state, c_old))
    log_p = _carry(_context_rows(old_log_p, new_s.n_contexts), sources, _same, _same, share)
    return new_s.state_from_log_p(_log_normalise(log_p), c_new)


def _across_learners(
    bandit: Bandit, new: Bandit, sources: list[int | None], share: float | None
) -> np.ndarray:
    """The new state when the learner changes (see the module); sets V (S) and D too."""
    new_s = new.structure
    keep = bandit._table.kernel.tsallis and new._table.kernel.tsallis  # S and D kept
    if all(s is None for s in sources) or not bandit._d_mant:
        if not keep:
            new._vn, new._d_mant, new._d_exp = 0.0, 0.0, 0
        new._arm_stats = _carried_arm_stats(bandit, new, sources, keep)
        return new_s.initial_state()
    n_old = bandit.structure.n_contexts
    old_log_p = log_array([bandit.weight_shares(c if n_old > 1 else None) for c in range(n_old)])
    log_p = _carry(_context_rows(old_log_p, new_s.n_contexts), sources, _same, _same, share)
    log_p = _log_normalise(log_p)
    if new._table.kernel.tsallis:
        if not keep:
            new._vn, new._d_mant, new._d_exp = 0.0, 0.0, 0
        new._clocks = _carried_clocks(bandit, new, keep)
        new._context_means = _carried_means(bandit, new)
        new._arm_stats = _carried_arm_stats(bandit, new, sources, keep)
        eta = new._table.kernel.tsallis_rates(new._row)[:, None]  # each context's η̃
        floored = exp_array(np.maximum(log_p, kernel_log(math.ulp(0.0))))
        root = 2.0 / np.sqrt(floored)
        return (root - root.min(axis=-1, keepdims=True)) / eta
    new._vn = 0.0
    return new_s.state_from_log_p(log_p, new._table.kernel.scale(0.0))


def _carried_clocks(bandit: Bandit, new: Bandit, keep: bool) -> np.ndarray:
    """The new Tsallis learner's context clocks: 0 when it starts (S = 0); else each old
    context's by index, and for a context the old class lacked the one the old total S
    gives (``Kernel.clocks_from_total``)."""
    kernel = new._table.kernel
    if not keep or not kernel.n_clocks:
        return np.zeros(kernel.n_clocks)
    clocks = kernel.clocks_from_total(bandit._vn)
    n = min(len(bandit._clocks), len(clocks))
    clocks[:n] = bandit._clocks[:n]
    return clocks


def _carried_means(bandit: Bandit, new: Bandit) -> np.ndarray:
    """The new Tsallis learner's context means and counts: each old context's by index
    where the old learner had them; else the mean ψ with a count of 0, which the
    context's next loss replaces (``Kernel.means_from_mean``)."""
    kernel = new._table.kernel
    block = kernel.means_from_mean(bandit.psi)
    old, c_old, c_new = bandit._context_means, len(bandit._clocks), kernel.n_clocks
    n = min(c_old, c_new)
    block[:n], block[c_new : c_new + n] = old[:n], old[c_old : c_old + n]
    return block


def _carried_arm_stats(
    bandit: Bandit, new: Bandit, sources: list[int | None], keep: bool
) -> np.ndarray:
    """The new Tsallis learner's per-arm gap statistics: none when it starts (D = 0); else
    each kept arm's own, the mean squares rescaled to a mean of 1 over the arms with a gap
    (D, kept, stays the root of their mean); a new arm joins at its first gap. Kept arms
    without one, with D set: ``Kernel.arm_stats_from_scale``."""
    kernel = new._table.kernel
    m, m_old = kernel.n_arm_stats, bandit.n_arms
    block = np.zeros(2 * m)
    if not keep or not m:
        return block
    for j, s in enumerate(sources):
        if s is not None:
            block[j], block[m + j] = bandit._arm_stats[s], bandit._arm_stats[m_old + s]
    played = block[m:] > 0
    if new._d_mant and not (block[:m] > 0).any():
        return kernel.arm_stats_from_scale(True)
    if played.any() and new._d_mant:
        block[:m] /= block[:m][played].mean()
    return block


def _check_arm_map(arm_map: Any, n_old: int) -> list[int | None]:
    if isinstance(arm_map, str | bytes | Mapping) or not isinstance(arm_map, Sequence | np.ndarray):
        raise ValueError(f"arm_map must be a sequence of old arm indices or None, got {arm_map!r}")
    if len(arm_map) == 0:
        raise ValueError("arm_map must name at least one arm, got an empty sequence")
    sources = [None if e is None else check_int("arm_map entry", e, 0, n_old - 1) for e in arm_map]
    seen: set[int] = set()
    for entry in sources:
        if entry in seen:
            raise ValueError(f"arm_map repeats old arm {entry!r}")
        if entry is not None:
            seen.add(entry)
    return sources


def _check_share(share: Any, n_fresh: int, n_kept: int) -> float | None:
    if share is None:
        return None
    s = check_real("new_arm_share", share, 0.0, 1.0)
    if s in (0.0, 1.0):
        raise ValueError(f"new_arm_share must be in (0, 1), got {share!r}")
    if n_fresh and not n_kept:
        raise ValueError(f"new_arm_share={share!r} needs at least one kept arm")
    if n_fresh * s >= 1.0:
        raise ValueError(f"new_arm_share={share!r} times {n_fresh} new arms is not below 1")
    return s


def _lse(x: np.ndarray) -> np.ndarray:
    """log Σ exp over the last axis (-inf where every entry is -inf)."""
    return log_sum_exp(np.ascontiguousarray(x))  # the kernel's arithmetic: the same bits


def _log_normalise(log_w: np.ndarray) -> np.ndarray:
    """Rows of log-weights to log-probabilities; a row with no weight at all becomes uniform."""
    total = _lse(log_w)[:, None]
    uniform = np.full_like(log_w, -kernel_log(log_w.shape[1]))
    return np.where(np.isfinite(total), log_w - np.where(np.isfinite(total), total, 0.0), uniform)


def _context_rows(log_p: np.ndarray, n_new: int) -> np.ndarray:
    """Old log p rows for the new contexts: by index when both classes are contextual, else
    (and for contexts the old class lacks) the mean p over the old contexts."""
    n_old = len(log_p)
    mean = log_p[0] if n_old == 1 else _lse(log_p.T) - kernel_log(n_old)
    both = n_old > 1 and n_new > 1
    return np.array([log_p[r] if both and r < n_old else mean for r in range(n_new)])


def _same(values: np.ndarray) -> np.ndarray:
    return values


def _carry(
    state: np.ndarray,
    sources: list[int | None],
    to_log: Transform,
    from_log: Transform,
    share: float | None,
) -> np.ndarray:
    """Kept arms' columns (last axis) exactly; each new arm's from the kept arms'
    log-weights ``to_log(state)``: their mean (finite ones), or the log-weight giving
    p = ``share``, turned back into a state value by ``from_log``."""
    kept = [i for i, s in enumerate(sources) if s is not None]
    fresh = [i for i, s in enumerate(sources) if s is None]
    out = np.empty((*state.shape[:-1], len(sources)))
    out[..., kept] = state[..., [sources[i] for i in kept]]
    if fresh:
        log_w = to_log(out[..., kept])
        if share is None:
            finite = np.isfinite(log_w)
            total = sum_last(np.where(finite, log_w, 0.0))
            value = total / np.maximum(finite.sum(axis=-1), 1)
        else:
            value = kernel_log(share / (1.0 - len(fresh) * share)) + _lse(log_w)
        out[..., fresh] = from_log(value)[..., None]
    return out
