# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, embedsignature=True
"""The compiled round of the algorithm: every class, one arithmetic, one instance or many.

``Bandit`` (one instance), ``BatchBandit`` (many) and the service all call the functions
here, so given the same draws they make the same selections bit for bit, on any machine:
the extension is built without fast-math and without fused multiply-add (setup.py), sums
run in one fixed order, and exp/log are the project's own (``_kernel_src/detmath.h``).

An instance is one row of a float64 table (``Table.rows``, shape (n, width))::

    PSI  VN  D_MANT  D_EXP  N_UPDATES  N_ROUNDS  state...

ψ; V/D² (the Tsallis learner: S = Σ(1 - q) of the updates); D = D_MANT·2^D_EXP (the
Tsallis learner: the range of the gaps l - baseline, not of φ); the counters (exact integers in a double up to 2^53); then
the class's state: Φ/D per (context, arm) for Fixed and Contextual, the weights per arm
normalised to sum 1 (Switching: a fixed share keeps every weight above α/M, no log domain
needed, and a selection needs no exp), normalised log-weights per class (Markov); then,
for the Tsallis learner with several contexts, each context's clock S_c = Σ(1 - q) of its
own updates (``n_clocks`` columns: every context runs on its own learning rate), then each
context's mean loss m_c and the count of losses in it (``n_clocks`` columns each: gaps are
taken from the context's mean shrunk towards ψ, ``context_baseline``); last, for the
Tsallis learner, each arm's mean squared gap in units of D² and its count of gaps
(after the number of arms with a gap; ``n_arm_stats`` columns each: D² is the mean of
those means over the arms, ``arm_scale``).

>>> k = Kernel("cumulative", n_arms=3, n_contexts=1, gamma=1.0)
>>> t = Table(k, k.initial_rows(2))
>>> arm, q, p, n, why = t.select(0, 0, 0.5)      # instance 0, context 0, u = 0.5
>>> t.update(0, 0, arm, q, p, 7.0)
>>> t.rows[:, N_UPDATES].tolist()
[1.0, 0.0]
"""

import numpy as np

from libc.math cimport (
    INFINITY, copysign, fabs, floor, frexp, isfinite, isinf, isnan, ldexp, sqrt,
)
from libc.stdint cimport int8_t, int64_t

from tsi_core._kernel cimport (
    C_D_EXP, C_D_MANT, C_HEAD, C_N_ROUNDS, C_N_UPDATES, C_PSI, C_VN, CUMULATIVE, MARKOV,
    SWITCHING, WHY_BANDIT, WHY_BURN_IN, WHY_FORCED, WHY_HOLDOUT, Alloc, Serving, Step,
)

cdef extern from "_kernel_src/detmath.h":
    double tsi_exp(double x) noexcept nogil
    double tsi_log(double x) noexcept nogil

cdef extern from "_kernel_src/lanes.h":
    double tsi_min_of(const double* x, Py_ssize_t n) noexcept nogil
    void tsi_power_sums(const double* y, Py_ssize_t n, double z, double* f,
                        double* g) noexcept nogil

PSI, VN, D_MANT, D_EXP, N_UPDATES, N_ROUNDS, HEAD = range(7)

#: the Tsallis learner's cut: an estimate counts a gap l - m as at most TSALLIS_CUT·D (D
#: the growth-bounded RMS of the gaps); D itself and the mean see every gap
TSALLIS_CUT = 100.0
cdef double CUT = TSALLIS_CUT
#: the Tsallis learner's bound on a negative estimate: -TSALLIS_LOW/(η̃·sqrt(q)) (1 is the
#: stability condition of Tsallis-INF's analysis; chosen on the tuning tables, 400 seeds:
#: bench/bobw/estimate_bound.md)
TSALLIS_LOW = 0.75
cdef double LOW = TSALLIS_LOW
#: several contexts: a context's baseline weighs its own mean by its count of losses k
#: against the mean of every loss weighted TSALLIS_PRIOR: (k·m_c + P·ψ)/(k + P)
TSALLIS_PRIOR = 30.0
cdef double PRIOR = TSALLIS_PRIOR
#: the Tsallis learner reads each gap in units of D rounded to a multiple of 2^-TSALLIS_GRID:
#: every later quantity is a function of that number, so a map of the losses that rounds
#: (1000·l + 10^6) changes nothing unless a gap falls within its rounding of a grid point
TSALLIS_GRID = 10
cdef double GRID = 2.0 ** TSALLIS_GRID

KINDS = {"cumulative": CUMULATIVE, "switching": SWITCHING, "markov": MARKOV}

#: why a selection's arm was served, by the code the round records (``TicketBatch.why``)
WHYS = tuple(dict(sorted({
    WHY_BANDIT: "bandit", WHY_HOLDOUT: "holdout", WHY_BURN_IN: "burn_in", WHY_FORCED: "forced"
}.items())).values())


def exp(double x) -> float:
    """e^x, the same bits on every machine (below 1 ulp from the true value).

    >>> exp(0.0), exp(float("-inf"))
    (1.0, 0.0)
    """
    return tsi_exp(x)


def log(double x) -> float:
    """Natural log, the same bits on every machine; log(0) = -inf.

    >>> log(1.0), log(0.0)
    (0.0, -inf)
    """
    return tsi_log(x)


ctypedef double (*Unary)(double) noexcept nogil


cdef object _each(values, Unary f):
    """``f`` of every entry of a float array (a new array of the same shape)."""
    cdef double[::1] v = np.array(values, dtype=float).ravel()
    cdef Py_ssize_t i
    for i in range(v.shape[0]):
        v[i] = f(v[i])
    return np.asarray(v).reshape(np.shape(values))


def log_array(values) -> np.ndarray:
    """``log`` of every entry of a float array (a new array)."""
    return _each(values, tsi_log)


def exp_array(values) -> np.ndarray:
    """``exp`` of every entry of a float array (a new array).

    >>> exp_array([0.0, float("-inf")]).tolist()
    [1.0, 0.0]
    """
    return _each(values, tsi_exp)


def sum_last(values) -> np.ndarray:
    """Sums over the last axis, each added from first to last (numpy's pairwise and SIMD
    sums change the order, and so the last bits, with the machine).

    >>> sum_last([[1.0, 2.0], [3.0, 4.0]]).tolist()
    [3.0, 7.0]
    """
    cdef Py_ssize_t r, i
    cdef double total
    cdef double[:, ::1] v
    cdef double[::1] o
    array = np.ascontiguousarray(values, dtype=float)
    v = array.reshape(-1, array.shape[array.ndim - 1])  # no wraparound in this module
    out = np.zeros(v.shape[0])
    o = out
    for r in range(v.shape[0]):
        total = 0.0
        for i in range(v.shape[1]):
            total = total + v[r, i]
        o[r] = total
    return out.reshape(array.shape[:-1])


def log_sum_exp(values) -> np.ndarray:
    """log Σ exp over the last axis in the kernel's arithmetic: the same bits everywhere;
    -inf where every entry is -inf.

    >>> log_sum_exp([[0.0, 0.0], [float("-inf"), float("-inf")]]).tolist()
    [0.6931471805599453, -inf]
    """
    cdef Py_ssize_t r, i
    cdef double top, total
    cdef double[:, ::1] v
    cdef double[::1] o
    array = np.ascontiguousarray(values, dtype=float)
    v = array.reshape(-1, array.shape[array.ndim - 1])  # no wraparound in this module
    out = np.empty(v.shape[0])
    o = out
    for r in range(v.shape[0]):
        top = -INFINITY
        for i in range(v.shape[1]):
            if v[r, i] > top:
                top = v[r, i]
        if top == -INFINITY:
            o[r] = top
            continue
        total = 0.0
        for i in range(v.shape[1]):
            total = total + tsi_exp(v[r, i] - top)
        o[r] = tsi_log(total) + top
    return out.reshape(array.shape[:-1])


cdef inline void observe(const double* row, double loss, double q, double p, bint mean,
                         int growth, bint grid, Step* s) noexcept nogil:
    """Fold one loss (drawn with probability q, weight share p) into the baseline, V/D², D.

    The baseline (the ψ column) is the running minimum of the losses, or (``mean``) the
    running mean of the losses before this one. ``growth`` >= 0 bounds |φ| to 2^growth·D
    (D grows at most that much); the mean then takes the loss as cut. ``grid``: φ/D is
    read on the grid of ``TSALLIS_GRID`` first (``observe_on_grid``)."""
    cdef double psi = row[C_PSI]
    cdef double vn = row[C_VN]
    cdef double d_mant = row[C_D_MANT]
    cdef int d_exp = <int>row[C_D_EXP]
    cdef double gap, g_mant, phi_mant, a_mant, new_vn
    cdef double n = row[C_N_UPDATES]
    cdef int g_exp, phi_exp
    if mean and n == 0.0:  # the first loss is the mean; φ = 0
        psi = loss
    s.psi = psi if mean else (loss if loss < psi else psi)
    gap = loss - s.psi
    if isinf(gap):  # loss - baseline beyond float64: halve both operands first
        g_mant = frexp(loss * 0.5 - s.psi * 0.5, &g_exp)
        g_exp += 1
    else:
        g_mant = frexp(gap, &g_exp)
    if g_mant == 0.0:  # φ = 0: nothing but the baseline changes
        s.vn, s.d_mant, s.d_exp = vn, d_mant, d_exp
        s.x, s.ratio, s.r, s.active = 0.0, 1.0, 1.0, d_mant != 0.0
        return
    phi_mant = frexp(g_mant / q, &phi_exp)
    phi_exp += g_exp
    a_mant = fabs(phi_mant)
    if grid and d_mant != 0.0:
        observe_on_grid(ldexp(phi_mant / d_mant, phi_exp - d_exp), vn, d_mant, d_exp, q, p,
                        n, mean, growth, psi, s)
        return
    if growth >= 0 and d_mant != 0.0 and (
            phi_exp > d_exp + growth or (phi_exp == d_exp + growth and a_mant > d_mant)):
        phi_mant, a_mant, phi_exp = copysign(d_mant, phi_mant), d_mant, d_exp + growth
    if d_mant == 0.0 or phi_exp > d_exp or (phi_exp == d_exp and a_mant > d_mant):
        s.ratio = 0.0 if d_mant == 0.0 else ldexp(d_mant / a_mant, d_exp - phi_exp)
        new_vn = vn * s.ratio * s.ratio + p
        s.x = copysign(1.0, phi_mant)
        s.d_mant, s.d_exp = a_mant, phi_exp
    else:
        s.ratio = 1.0
        s.x = ldexp(phi_mant / d_mant, phi_exp - d_exp)
        new_vn = vn + p * s.x * s.x
        s.d_mant, s.d_exp = d_mant, d_exp
    s.vn = new_vn
    s.r = s.ratio * sqrt((vn + 1.0) / (new_vn + 1.0))
    s.active = True
    if mean:  # mean' = mean + (l - mean)/(n + 1), l as cut (l - mean = φ·q)
        s.psi = psi + ldexp(phi_mant * q / (n + 1.0), phi_exp)


cdef inline void observe_on_grid(double x, double vn, double d_mant, int d_exp, double q,
                                 double p, double n, bint mean, int growth, double psi,
                                 Step* s) noexcept nogil:
    """``observe`` once D is set, with x = φ/D rounded to a multiple of 2^-TSALLIS_GRID:
    every quantity the weights read (x, V/D², D'/D) is then a function of that number, so
    a map of the losses that rounds changes no bit of them unless φ/D falls within its
    rounding of a grid point."""
    cdef int e
    cdef double a
    x = floor(x * GRID + 0.5) / GRID
    a = fabs(x)
    if growth >= 0 and a > ldexp(1.0, growth):
        a = ldexp(1.0, growth)
        x = copysign(a, x)
    if mean:  # mean' = mean + (l - mean)/(n + 1), l as cut (l - mean = x·D·q)
        s.psi = psi + ldexp(x * d_mant * q / (n + 1.0), d_exp)
    if a > 1.0:
        s.ratio = 1.0 / a
        s.vn = vn * s.ratio * s.ratio + p
        s.x = copysign(1.0, x)
        s.d_mant = frexp(d_mant * a, &e)
        s.d_exp = d_exp + e
    else:
        s.ratio, s.x = 1.0, x
        s.vn = vn + p * x * x
        s.d_mant, s.d_exp = d_mant, d_exp
    s.r = s.ratio * sqrt((vn + 1.0) / (s.vn + 1.0))
    s.active = True


cdef inline double fixed_sum(const double* x, Py_ssize_t n) noexcept nogil:
    """Σx in one fixed order: four running sums over x[0::4], x[1::4], x[2::4], x[3::4],
    then (s0 + s1) + (s2 + s3). Four independent chains run four times faster than one
    sum in index order, and the order is the same on every machine."""
    cdef double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0
    cdef Py_ssize_t i = 0
    while i + 4 <= n:
        s0 += x[i]
        s1 += x[i + 1]
        s2 += x[i + 2]
        s3 += x[i + 3]
        i += 4
    if i < n:
        s0 += x[i]
    if i + 1 < n:
        s1 += x[i + 1]
    if i + 2 < n:
        s2 += x[i + 2]
    return (s0 + s1) + (s2 + s3)


cdef inline double clamped(double x, double lim) noexcept nogil:
    """x kept within [-lim, lim]."""
    return lim if x > lim else (-lim if x < -lim else x)


cdef inline double gap_of(double loss, double m, int* g_exp) noexcept nogil:
    """The mantissa of loss - m (its exponent into ``g_exp``), also beyond float64's range
    (both operands halved first)."""
    cdef double g_mant
    if isinf(loss - m):
        g_mant = frexp(loss * 0.5 - m * 0.5, g_exp)
        g_exp[0] += 1
        return g_mant
    return frexp(loss - m, g_exp)


cdef inline double mean_step(double m, double loss, double count, double d_mant, int d_exp,
                             double lim) noexcept nogil:
    """The mean m of ``count`` losses after one more: the gap counts only as far as lim·D
    (D = d_mant·2^d_exp; D = 0: in full)."""
    cdef int g_exp
    cdef double g_mant = gap_of(loss, m, &g_exp)
    if d_mant == 0.0:
        return m + ldexp(g_mant / (count + 1.0), g_exp)
    return m + ldexp(clamped(ldexp(g_mant / d_mant, g_exp - d_exp), lim) * d_mant
                     / (count + 1.0), d_exp)


cdef inline void normalise(double* logw, Py_ssize_t n) noexcept nogil:
    """Subtract the log-sum-exp (all -inf stays as it is up to NaN, as numpy had it)."""
    cdef Py_ssize_t i
    cdef double top = logw[0]
    cdef double total = 0.0
    for i in range(1, n):
        if logw[i] > top:
            top = logw[i]
    if not isfinite(top):
        top = 0.0
    for i in range(n):
        total += tsi_exp(logw[i] - top)
    total = tsi_log(total) + top
    for i in range(n):
        logw[i] = logw[i] - total


cdef inline double powered(double v, const Step* s, double eta_phi, bint hit) noexcept nogil:
    """log z = r·log w - η·φ·[hit], with r·(-inf) = -inf."""
    return (s.r * v if isfinite(v) else -INFINITY) - (eta_phi if hit else 0.0)


cdef inline double base_share(const Serving* sv, double w) noexcept nogil:
    """π of an eligible arm of weight w (``Kernel.serving``)."""
    if sv.uniform:
        return 1.0 / sv.n_eligible
    return sv.floor + sv.keep * ((w * sv.scale + sv.spread) / sv.norm)


cdef inline double served_share(const Serving* sv, double w, Py_ssize_t arm) noexcept nogil:
    """P(arm) = s·[arm = h] + (1 - s)·π_arm, the probability an eligible arm is served."""
    return (1.0 - sv.share) * base_share(sv, w) + (sv.share if arm == sv.holdout_arm else 0.0)


cdef inline const unsigned char* row_mask(const unsigned char* mask,
                                          Py_ssize_t offset) noexcept nogil:
    """An event's eligible mask within a batch's (NULL stays NULL: every arm)."""
    if mask == NULL:
        return mask
    return mask + offset


cdef Alloc alloc_of(object allocation, int n_arms) except *:
    """The round's view of an ``Allocation`` (None: none), checked against ``n_arms``."""
    from tsi_core.allocation import Allocation
    cdef Alloc a
    a.active, a.min_share, a.holdout_share, a.holdout_arm = False, 0.0, 0.0, -1
    a.burn_in, a.forced, a.force_arm = 0.0, False, -1
    if allocation is None:
        return a
    if not isinstance(allocation, Allocation):
        raise ValueError(f"allocation must be an Allocation or None, got {allocation!r}")
    if allocation.plain:
        return a
    allocation.check(n_arms)
    a.active = True
    a.min_share = allocation.min_share
    a.holdout_share = allocation.holdout_share
    a.holdout_arm = -1 if allocation.holdout_arm is None else allocation.holdout_arm
    a.burn_in = allocation.burn_in
    a.forced = allocation.force_arm is not None
    a.force_arm = allocation.force_arm if a.forced else -1
    return a


cdef class Kernel:
    """One configuration's round (class kind, arms, contexts, γ, transition); no state.

    ``kind`` is "cumulative" (Fixed, Contextual: ``n_contexts`` rows of Φ/D),
    "switching" (``rate`` a constant share, or None for the decaying 1/(t+1)) or
    "markov" (``arm_of`` per class, edges ``src`` → grouped by target with ``starts``,
    ``log_t`` their log-probabilities, ``log_initial`` the initial log-weights).
    """

    def __init__(self, str kind, int n_arms, int n_contexts=1, double gamma=1.0,
                 rate=None, arm_of=None, src=None, dst=None, log_t=None,
                 log_initial=None, str baseline="min", bint adaptive=False,
                 step_cap=None, growth=None, str learner="exp"):
        if kind not in KINDS:
            raise ValueError(f"kernel kind must be one of {sorted(KINDS)}, got {kind!r}")
        if n_arms < 1 or n_contexts < 1 or not (gamma > 0.0 and isfinite(gamma)):
            raise ValueError(f"bad kernel configuration: {n_arms=}, {n_contexts=}, {gamma=}")
        if baseline not in ("min", "mean"):
            raise ValueError(f"baseline must be 'min' or 'mean', got {baseline!r}")
        if step_cap is not None and not (step_cap > 0.0):
            raise ValueError(f"step_cap must be > 0 or None, got {step_cap!r}")
        if growth is not None and not (1 <= growth <= 64):
            raise ValueError(f"growth must be in [1, 64] or None, got {growth!r}")
        if learner not in ("exp", "tsallis"):
            raise ValueError(f"learner must be 'exp' or 'tsallis', got {learner!r}")
        self.kind_name = kind
        self.kind = KINDS[kind]
        self.tsallis = learner == "tsallis" and self.kind == CUMULATIVE
        self.grid = learner == "tsallis" and baseline == "mean"
        self.mean_baseline, self.adaptive = baseline == "mean", adaptive
        self.step_cap = INFINITY if step_cap is None else step_cap
        self.growth = -1 if growth is None else growth
        self.n_arms, self.n_contexts, self.gamma = n_arms, n_contexts, gamma
        self.rate = -1.0 if rate is None else float(rate)
        self.n_classes = 0
        if self.kind == MARKOV:
            self._bind_markov(arm_of, src, dst, log_t)
            self.n_state = self.n_classes
            self.initial = np.array(log_initial, dtype=float)
        elif self.kind == SWITCHING:
            self.n_state = n_arms
            self.initial = np.full(n_arms, 1.0 / n_arms)
        else:
            self.n_state = n_contexts * n_arms
            self.initial = np.zeros(self.n_state)
        if self.initial.shape[0] != self.n_state:
            raise ValueError(f"initial state must have {self.n_state} entries")
        self.n_clocks = n_contexts if self.tsallis and n_contexts > 1 else 0
        self.n_arm_stats = n_arms if self.tsallis else 0
        # clocks, means, counts; then the arms with a gap, each arm's mean squared gap and
        # its count of gaps
        self.width = C_HEAD + self.n_state + 3 * self.n_clocks + (
            2 * self.n_arm_stats + 1 if self.tsallis else 0)
        self.scratch = np.zeros(2 * max(self.n_arms, self.n_state))

    def _bind_markov(self, arm_of, src, dst, log_t):
        arm = np.ascontiguousarray(arm_of, dtype=np.int64)
        s = np.ascontiguousarray(src, dtype=np.int64)
        d = np.ascontiguousarray(dst, dtype=np.int64)
        k = len(arm)
        if k < 1 or arm.min() < 0 or arm.max() >= self.n_arms:
            raise ValueError(f"arm_of must name arms in [0, {self.n_arms - 1}]")
        if len(s) != len(d) or len(s) != len(log_t) or (len(d) and (
                (np.diff(d) < 0).any() or s.min() < 0 or s.max() >= k or d.max() >= k)):
            raise ValueError("markov edges must be (src, dst, log_t) sorted by dst, in [0, K)")
        targets, starts = np.unique(d, return_index=True)
        self.n_classes = k
        self.arm_of, self.src = arm, s
        self.log_t = np.ascontiguousarray(log_t, dtype=float)
        self.targets = targets.astype(np.int64)
        self.starts = np.append(starts, len(d)).astype(np.int64)

    def initial_rows(self, Py_ssize_t n) -> np.ndarray:
        """n fresh instances: ψ = +inf (the mean baseline: 0, unused), V = D = 0, no rounds, the class's initial state."""
        rows = np.zeros((n, self.width))
        rows[:, C_PSI] = 0.0 if self.mean_baseline else INFINITY  # the mean: set by a loss
        rows[:, C_HEAD:C_HEAD + self.n_state] = np.asarray(self.initial)  # the rest at 0
        return rows

    def scale(self, double vn) -> float:
        """η·D for a V/D² of ``vn`` (see ``eta_d``)."""
        return self.eta_d(vn)

    def state_problem(self, state) -> str | None:
        """Why ``state`` (``n_state`` values, any sequence) cannot be an instance's state
        of this kernel, or None (see ``state_problem_of``).

        >>> Kernel("switching", n_arms=2).state_problem([0.0, 0.0])
        'switching weights must be finite, >= 0, and not all 0'
        """
        cdef double[::1] values = np.ascontiguousarray(state, dtype=float).ravel()
        if values.shape[0] != self.n_state:
            raise ValueError(f"a state has {self.n_state} values, got {values.shape[0]}")
        return self.state_problem_of(&values[0])

    def clocks_problem(self, clocks) -> str | None:
        """Why ``clocks`` (``n_clocks`` values) cannot be an instance's context clocks, or
        None: each is a Σ(1 - q), finite and >= 0.

        >>> Kernel("cumulative", 3, 2, learner="tsallis").clocks_problem([1.5, -1.0])
        'context clocks must be finite and >= 0, got -1.0'
        """
        cdef double[::1] values = np.ascontiguousarray(clocks, dtype=float).ravel()
        if values.shape[0] != self.n_clocks:
            raise ValueError(f"{self.n_clocks} context clocks, got {values.shape[0]}")
        return None if self.n_clocks == 0 else self.clocks_problem_of(&values[0])

    cdef str clocks_problem_of(self, const double* clocks):
        cdef Py_ssize_t i
        for i in range(self.n_clocks):
            if not (isfinite(clocks[i]) and clocks[i] >= 0.0):
                return f"context clocks must be finite and >= 0, got {clocks[i]!r}"
        return None

    def means_problem(self, means, counts, double n_updates) -> str | None:
        """Why ``means`` and ``counts`` (``n_clocks`` values each) cannot be an instance's
        context means, or None: each mean finite, each count a whole number >= 0, their
        sum at most the instance's ``n_updates``.

        >>> Kernel("cumulative", 3, 2, learner="tsallis").means_problem([1.0, 2.0], [3, 4], 5)
        'context counts must be whole numbers >= 0 summing to at most n_updates = 5, got [3.0, 4.0]'
        """
        block = np.concatenate([np.ravel(means), np.ravel(counts)]).astype(float)
        cdef double[::1] values = block
        if block.shape[0] != 2 * self.n_clocks:
            raise ValueError(f"{self.n_clocks} context means and counts, got {block.shape[0]}")
        return None if self.n_clocks == 0 else self.means_problem_of(&values[0], n_updates)

    cdef str means_problem_of(self, const double* block, double n_updates):
        cdef Py_ssize_t i, c = self.n_clocks
        cdef double total = 0.0
        cdef bint whole = True
        for i in range(c):
            if not isfinite(block[i]):
                return f"context means must be finite, got {block[i]!r}"
            whole = whole and block[c + i] >= 0.0 and block[c + i] == floor(block[c + i])
            total += block[c + i]
        if not (whole and total <= n_updates):
            counts = [block[c + i] for i in range(c)]
            return (f"context counts must be whole numbers >= 0 summing to at most "
                    f"n_updates = {n_updates:g}, got {counts}")
        return None

    def means_from_mean(self, double psi) -> np.ndarray:
        """Context means and counts (2·``n_clocks`` values) for a row written before each
        context had its own mean: every mean ψ, every count 0, so that each context's next
        loss sets its mean (``fill_means``).

        >>> Kernel("cumulative", 3, 2, learner="tsallis").means_from_mean(4.5).tolist()
        [4.5, 4.5, 0.0, 0.0]
        """
        out = np.zeros(2 * self.n_clocks)
        cdef double[::1] view = out
        if self.n_clocks:
            self.fill_means(psi, &view[0])
        return out

    cdef void fill_means(self, double psi, double* block) noexcept nogil:
        cdef Py_ssize_t i
        for i in range(self.n_clocks):
            block[i] = psi if isfinite(psi) else 0.0
            block[self.n_clocks + i] = 0.0

    def arm_stats_problem(self, mean_squares, counts, double n_updates) -> str | None:
        """Why ``mean_squares`` and ``counts`` (``n_arm_stats`` values each) cannot be an
        instance's per-arm gap statistics, or None: each mean square finite and >= 0, 0
        where the count is 0, each count a whole number from 0 to ``n_updates`` (a row
        written before arms had their own counts each 1: ``arm_stats_from_scale``).

        >>> Kernel("cumulative", 2, learner="tsallis").arm_stats_problem([1.5, 0.5], [2, 0], 9)
        'arm mean squares must be finite and >= 0, and 0 for an arm with no gap, got [1.5, 0.5]'
        """
        pair = np.concatenate([np.ravel(mean_squares), np.ravel(counts)]).astype(float)
        if pair.shape[0] != 2 * self.n_arm_stats:
            raise ValueError(f"{self.n_arm_stats} arm mean squares and counts, got {pair.shape[0]}")
        if self.n_arm_stats == 0:
            return None
        cdef double[::1] values = self.arm_block(pair)
        return self.arm_stats_problem_of(&values[0], n_updates)

    def arm_block(self, pair) -> np.ndarray:
        """The row's last columns for the arms' mean squares and counts ``pair`` (2·M
        values): the number of arms with a gap (a count above 0), then ``pair``; none for
        the exponential-weights learner.

        >>> Kernel("cumulative", 2, learner="tsallis").arm_block([1.5, 0.0, 3, 0]).tolist()
        [1.0, 1.5, 0.0, 3.0, 0.0]
        """
        pair = np.ravel(pair).astype(float)
        if self.n_arm_stats == 0:
            return pair
        return np.concatenate([[np.count_nonzero(pair[self.n_arm_stats:] > 0.0)], pair])

    cdef str arm_stats_problem_of(self, const double* stats, double n_updates):
        """The arms' block of a row: the number of arms with a gap, then the mean squares
        and the counts (``arm_scale``)."""
        cdef Py_ssize_t i, m = self.n_arm_stats
        cdef const double* block = stats + 1
        cdef bint whole = True, fine = True
        cdef double played = 0.0
        for i in range(m):
            played += block[m + i] > 0.0
            whole = whole and 0.0 <= block[m + i] <= n_updates and (
                block[m + i] == floor(block[m + i]))
            fine = fine and isfinite(block[i]) and block[i] >= 0.0 and (
                block[m + i] > 0.0 or block[i] == 0.0)
        if not fine:
            squares = [block[i] for i in range(m)]
            return (f"arm mean squares must be finite and >= 0, and 0 for an arm with no "
                    f"gap, got {squares}")
        if not whole:
            counts = [block[m + i] for i in range(m)]
            return (f"arm gap counts must be whole numbers from 0 to n_updates = "
                    f"{n_updates:g}, got {counts}")
        if stats[0] != played:
            return f"arms with a gap must be {played:g} (the counts above 0), got {stats[0]!r}"
        return None

    def arm_stats_from_scale(self, bint scaled) -> np.ndarray:
        """Per-arm gap statistics (2·``n_arm_stats`` values) for a row written before each
        arm had its own: once D is set (``scaled``), every arm's mean square 1 (D² their
        mean: D as it was) on a count of 1, so that the arm's next gaps soon outweigh it;
        before, none (``fill_arm_stats``).

        >>> Kernel("cumulative", 3, learner="tsallis").arm_stats_from_scale(True).tolist()
        [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
        """
        out = np.zeros(2 * self.n_arm_stats + 1)
        cdef double[::1] view = out
        if self.n_arm_stats:
            self.fill_arm_stats(scaled, &view[0])
        return out[1:]

    cdef void fill_arm_stats(self, bint scaled, double* stats) noexcept nogil:
        """The arms' block (``arm_stats_problem_of``) ``arm_stats_from_scale`` gives."""
        cdef Py_ssize_t i
        stats[0] = self.n_arm_stats if scaled else 0.0
        for i in range(2 * self.n_arm_stats):
            stats[1 + i] = 1.0 if scaled else 0.0

    def tsallis_rates(self, row) -> np.ndarray:
        """η̃ of every context of the instance ``row`` (``width`` values): ``tsallis_eta``.

        >>> k = Kernel("cumulative", 3, 2, gamma=2.0, learner="tsallis")
        >>> row = k.initial_rows(1)[0]
        >>> row[-12:-10] = [3.0, 15.0]                      # the two contexts' clocks
        >>> k.tsallis_rates(row).tolist()
        [1.0, 0.5]
        """
        cdef double[::1] values = np.ascontiguousarray(row, dtype=float)
        if values.shape[0] != self.width:
            raise ValueError(f"a row has {self.width} values, got {values.shape[0]}")
        out = np.empty(self.n_contexts)
        cdef Py_ssize_t c
        for c in range(self.n_contexts):
            out[c] = self.tsallis_eta(&values[0], <int>c)
        return out

    def clocks_from_total(self, double vn) -> np.ndarray:
        """Context clocks for a row written before each context had one (S the total in
        the VN column; see ``fill_clocks``).

        >>> Kernel("cumulative", 3, 4, learner="tsallis").clocks_from_total(99.0).tolist()
        [24.0, 24.0, 24.0, 24.0]
        """
        out = np.zeros(self.n_clocks)
        cdef double[::1] view = out
        if self.n_clocks:
            self.fill_clocks(vn, &view[0])
        return out

    cdef void fill_clocks(self, double vn, double* clocks) noexcept nogil:
        """S_c = max(0, (1 + S)/C - 1) for every context: with the default γ (now
        tsallis_scale per context, before tsallis_scale·sqrt(C) on one shared S) every
        context's rate γ/sqrt(1 + S_c) is the one it had."""
        cdef Py_ssize_t i
        cdef double v = (1.0 + vn) / self.n_contexts - 1.0
        for i in range(self.n_clocks):
            clocks[i] = v if v > 0.0 else 0.0

    cdef str state_problem_of(self, const double* state):
        """The rule of each kind for the ``n_state`` values at ``state``: cumulative Φ/D all
        finite; switching weights finite, >= 0 and not all 0; Markov log-weights with no
        NaN and no +inf (-inf is a weight of 0) and at least one finite."""
        cdef Py_ssize_t i, n = self.n_state
        cdef bint some = False
        if self.kind == CUMULATIVE:
            for i in range(n):
                if not isfinite(state[i]):
                    return "cumulative losses Φ/D must be finite"
            return None
        if self.kind == SWITCHING:
            for i in range(n):
                if not (isfinite(state[i]) and state[i] >= 0.0):
                    return "switching weights must be finite, >= 0, and not all 0"
                some = some or state[i] > 0.0
            return None if some else "switching weights must be finite, >= 0, and not all 0"
        for i in range(n):
            if isnan(state[i]) or state[i] == INFINITY:
                some = False
                break
            some = some or isfinite(state[i])
        return None if some else "a state needs finite values or -inf, and at least one finite one"

    # ------------------------------------------------------------ the round
    cdef double eta_d(self, double vn) noexcept nogil:
        """η·D, the weights' scale: γ/sqrt(V/D² + 1); with the adaptive γ
        γ·((V + D²)/V)^¼ / sqrt(V + D²)·D = γ / ((V/D²)·(V/D² + 1))^¼ (γ/sqrt(V/D² + 1)
        while V = 0)."""
        if self.adaptive and vn > 0.0:
            return self.gamma / sqrt(sqrt(vn) * sqrt(vn + 1.0))
        return self.gamma / sqrt(vn + 1.0)

    cdef double arm_weights(self, const double* state, int ctx, double c,
                            double* w) noexcept nogil:
        """Unnormalised arm weights w (the largest 1) into ``w``; returns Σw (``fixed_sum``)."""
        cdef Py_ssize_t i, m = self.n_arms
        cdef double top
        cdef const double* s
        if self.kind == CUMULATIVE:
            s = state + ctx * m
            top = s[0]
            for i in range(1, m):
                if s[i] < top:
                    top = s[i]
            for i in range(m):
                w[i] = tsi_exp((top - s[i]) * c)
        elif self.kind == SWITCHING:  # the state holds the weights themselves
            for i in range(m):
                w[i] = state[i]
        else:
            top = state[0]
            for i in range(1, self.n_classes):
                if state[i] > top:
                    top = state[i]
            for i in range(m):
                w[i] = 0.0
            for i in range(self.n_classes):
                w[self.arm_of[i]] += tsi_exp(state[i] - top)
        return fixed_sum(w, m)

    cdef double tsallis_weights(self, const double* row, int ctx, double* w) noexcept nogil:
        """½-Tsallis-INF (Zimmert & Seldin 2021): w_i = 4/(y_i - z)² with y_i = η̃·(Φ_i/D -
        min_j Φ_j/D) >= 0, η̃ = γ/sqrt(1 + S) (S = Σ(1 - q) over the context's updates so
        far, ``tsallis_eta``: about t(1 - 1/M) while play stays spread, O(log t) once it
        settles on one arm; Ito 2021's self-bounding rate) and z < 0 the normaliser
        (Σw = 1 up to rounding), found by Newton's method on h(z) = (Σw(z))^(-1/2) - 1 from
        z = -2, where the leader alone has w = 1. h is linear in z when one arm holds the
        weight or all arms are level (one step), and concave and decreasing in general (a
        power mean of the (y_i - z)/2), so the iterates fall monotonically to the root.
        Only +, -, ×, / and sqrt (exact in IEEE arithmetic): the same bits everywhere.
        Returns Σw (``fixed_sum``)."""
        cdef Py_ssize_t i, k, m = self.n_arms
        cdef const double* s = row + C_HEAD + ctx * m
        cdef double eta = self.tsallis_eta(row, ctx)
        cdef double top = tsi_min_of(s, m)
        cdef double z = -2.0
        cdef double f, g, r, step
        for i in range(m):
            w[i] = eta * (s[i] - top)
        for k in range(64):
            tsi_power_sums(w, m, z, &f, &g)
            step = 2.0 * f * (sqrt(f) - 1.0) / g  # h/h', h' = -g/(2·f^(3/2))
            z -= step
            if not (step > 1e-10 * -z):  # quadratic: the error left is about step²/|z|
                break
        for i in range(m):
            r = 2.0 / (w[i] - z)
            w[i] = r * r
        return fixed_sum(w, m)

    cdef inline double tsallis_eta(self, const double* row, int ctx) noexcept nogil:
        """η̃ of context ``ctx``: γ/sqrt(1 + S_c), S_c its clock (one context: the VN column)."""
        if self.n_clocks:
            return self.gamma / sqrt(row[C_HEAD + self.n_state + ctx] + 1.0)
        return self.gamma / sqrt(row[C_VN] + 1.0)

    cdef double mixing(self, const double* row) noexcept nogil:
        """ε_t = min(1/2, sqrt(M/t)), t = updates so far + 1."""
        cdef double eps = sqrt(<double>self.n_arms / (row[C_N_UPDATES] + 1.0))
        return 0.5 if eps > 0.5 else eps

    cdef double policy(self, const double* row, int ctx, double* w, double* scale,
                       double* spread) noexcept nogil:
        """Arm weights w into ``w``; q_i = w_i·scale + spread (scale = (1-ε)/Σw,
        spread = ε/M). Returns Σw. Tsallis-INF: its own weights, no ε-mixing (spread = 0)."""
        cdef double total, eps
        if self.tsallis:
            total = self.tsallis_weights(row, ctx, w)
            spread[0] = 0.0
            scale[0] = 1.0 / total
            return total
        total = self.arm_weights(row + C_HEAD, ctx, self.eta_d(row[C_VN]), w)
        eps = self.mixing(row)
        spread[0] = eps / self.n_arms
        scale[0] = (1.0 - eps) / total
        return total

    cdef void select_row(self, double* row, int ctx, double u, const Alloc* alloc,
                         const unsigned char* mask, int64_t* arm, double* q, double* p,
                         int* why) noexcept nogil:
        """Inverse-CDF draw of an arm with the uniform draw u; records the probability it
        was served with (q) and its weight share p = w/Σw (the learner's, always). Without
        an allocation (``alloc`` NULL or inactive) and eligibility (``mask`` NULL) the draw
        is from q = w·((1-ε)/Σw) + ε/M; otherwise the allocation's rule applies (a forced
        arm, a holdout, the base distribution of ``serving``). Counts the selection."""
        cdef double* w = &self.scratch[0]
        cdef double scale, spread, total, share, acc = 0.0
        cdef Py_ssize_t i, chosen = 0, last = -1
        cdef Serving sv
        if (alloc == NULL or not alloc.active) and mask == NULL:
            total = self.policy(row, ctx, w, &scale, &spread)
            if self.n_arms <= 64:  # few arms: count the cumulative q <= u, without branches
                for i in range(self.n_arms):
                    acc += w[i] * scale + spread
                    chosen += acc <= u
            else:  # many arms: stop at the first cumulative q above u
                chosen = self.n_arms
                for i in range(self.n_arms):
                    acc += w[i] * scale + spread
                    if u < acc:
                        chosen = i
                        break
            if chosen > self.n_arms - 1:
                chosen = self.n_arms - 1
            arm[0], why[0] = chosen, WHY_BANDIT
            q[0] = w[chosen] * scale + spread
        else:
            total = self.serving(row, ctx, alloc, mask, w, &sv)
            if alloc != NULL and alloc.forced:
                chosen, why[0] = alloc.force_arm, WHY_FORCED
            elif sv.share > 0.0 and u < sv.share:
                chosen, why[0] = sv.holdout_arm, WHY_HOLDOUT
            else:  # from π, with the draw that remains: u' = (u - s)/(1 - s)
                u = (u - sv.share) / (1.0 - sv.share)
                chosen = -1
                for i in range(self.n_arms):
                    if mask != NULL and not mask[i]:
                        continue
                    share = base_share(&sv, w[i])
                    acc += share
                    if share > 0.0:
                        last = i
                    if u < acc:
                        chosen = i
                        break
                if chosen < 0:  # u beyond the rounded total: the last arm that can be served
                    chosen = last
                why[0] = sv.why
            arm[0] = chosen
            q[0] = 1.0 if why[0] == WHY_FORCED else served_share(&sv, w[chosen], chosen)
        p[0] = w[chosen] / total
        row[C_N_ROUNDS] += 1.0

    cdef double serving(self, const double* row, int ctx, const Alloc* alloc,
                        const unsigned char* mask, double* w, Serving* sv) noexcept nogil:
        """The base distribution π of the next selection over the eligible arms E
        (``mask``, NULL for all), and the holdout's share of this request: the rule of
        ``tsi_core.allocation``. π is uniform over E while the selections so far are fewer
        than the burn-in; else the learner's q restricted to E and renormalised (q̃ = q
        when E is every arm; uniform when Σ_E q underflows to 0), floored additively:
        π_a = f + (1 - M_e·f)·q̃_a. The holdout (arm h, share s) applies when h is in E.
        Writes the learner's weights into ``w`` and returns Σw (``policy``)."""
        cdef Py_ssize_t i
        cdef double total = self.policy(row, ctx, w, &sv.scale, &sv.spread)
        cdef double norm = 0.0
        sv.n_eligible = self.n_arms
        if mask != NULL:
            sv.n_eligible = 0
            for i in range(self.n_arms):
                if mask[i]:
                    sv.n_eligible += 1
                    norm += w[i] * sv.scale + sv.spread
        sv.norm = 1.0 if sv.n_eligible == self.n_arms else norm
        sv.why = WHY_BANDIT
        sv.uniform = not (sv.norm > 0.0)
        sv.floor, sv.share, sv.holdout_arm = 0.0, 0.0, -1
        if alloc != NULL and alloc.active:
            if row[C_N_ROUNDS] < alloc.burn_in:
                sv.uniform, sv.why = True, WHY_BURN_IN
            sv.floor = alloc.min_share
            if alloc.holdout_share > 0.0 and (mask == NULL or mask[alloc.holdout_arm]):
                sv.share, sv.holdout_arm = alloc.holdout_share, alloc.holdout_arm
        if sv.uniform:
            sv.floor = 0.0
        sv.keep = 1.0 - sv.n_eligible * sv.floor
        return total

    cdef void policy_row(self, const double* row, int ctx, double* out) noexcept nogil:
        cdef double* w = &self.scratch[0]
        cdef double scale, spread
        cdef Py_ssize_t i
        self.policy(row, ctx, w, &scale, &spread)
        for i in range(self.n_arms):
            out[i] = w[i] * scale + spread

    cdef void serving_row(self, const double* row, int ctx, const Alloc* alloc,
                          const unsigned char* mask, double* out) noexcept nogil:
        """P, the probability of each arm at the next selection (0 for arms not eligible):
        the probability ``select_row`` logs for the arm it serves."""
        cdef double* w = &self.scratch[0]
        cdef Serving sv
        cdef Py_ssize_t i
        if (alloc == NULL or not alloc.active) and mask == NULL:
            self.policy_row(row, ctx, out)
            return
        self.serving(row, ctx, alloc, mask, w, &sv)
        for i in range(self.n_arms):
            if alloc != NULL and alloc.forced:
                out[i] = 1.0 if i == alloc.force_arm else 0.0
            elif mask != NULL and not mask[i]:
                out[i] = 0.0
            else:
                out[i] = served_share(&sv, w[i], i)

    cdef void update_row(self, double* row, int ctx, int64_t arm, double q, double p,
                         double loss) noexcept nogil:
        """Observe the loss, update the class's state, then the statistics."""
        cdef Step s
        cdef double n = row[C_N_UPDATES] + 1.0
        cdef double c, floor
        if self.tsallis:
            self.tsallis_update(row, ctx, arm, q, loss)
            return
        observe(row, loss, q, p, self.mean_baseline, self.growth, self.grid, &s)
        if self.n_arms > 1 and not self.tsallis:
            c = self.eta_d(s.vn)
            if self.adaptive and s.ratio != 0.0:  # η_t/η_{t-1} with γ moving too
                s.r = s.ratio * (c / self.eta_d(row[C_VN]))
            if c * fabs(s.x) > self.step_cap:  # the step η·φ, bounded
                s.x = copysign(self.step_cap / c, s.x)
            if self.kind == CUMULATIVE:
                self.cumulative_update(row + C_HEAD, ctx, arm, &s)
            elif self.kind == SWITCHING:
                self.switching_update(row + C_HEAD, arm, &s, c, n)
            else:
                self.markov_update(row + C_HEAD, arm, &s, c)
        row[C_PSI], row[C_VN], row[C_D_MANT], row[C_D_EXP] = s.psi, s.vn, s.d_mant, s.d_exp
        row[C_N_UPDATES] = n

    cdef void tsallis_update(self, double* row, int ctx, int64_t arm, double q,
                             double loss) noexcept nogil:
        """The Tsallis learner's update (``Variant.learner``; VARIANTS.md, "bobw").

        Statistics: m (the ψ column) the mean of the losses (several contexts: the gap is
        from ``context_baseline`` instead); D² the mean over the arms of each arm's mean
        squared gap l - m (``arm_scale``: every gap counted, each only as far as D at most
        doubles in one update); m takes the gap as far as lim·D; S (the VN column) and the
        context's clock += 1 - q. The estimate of the played arm, in units of the new D, is
        (l - m)/(q·D) with the uncut gap, cut to ±K (K = ``TSALLIS_CUT``) and bounded below
        by -c/(η̃·sqrt(q)) (c = ``TSALLIS_LOW``, ``tsallis_estimate``); when D changes the
        whole state is rescaled to the new unit."""
        cdef Py_ssize_t i
        cdef double n = row[C_N_UPDATES]  # losses before this one: n gaps with this one
        cdef double lim = sqrt(1.0 + 3.0 * n)  # a gap beyond lim·D would more than double D
        cdef double m = row[C_PSI]
        cdef bint one_mean = self.n_clocks == 0  # else ψ and the context means move apart
        cdef double d_mant = row[C_D_MANT]
        cdef int d_exp = <int>row[C_D_EXP]
        cdef double eta = self.tsallis_eta(row, ctx)
        cdef double g_mant, u, f, ratio, full
        cdef int g_exp, e
        row[C_N_UPDATES] = n + 1.0
        row[C_VN] = row[C_VN] + (1.0 - q)
        if not one_mean:
            row[C_HEAD + self.n_state + ctx] += 1.0 - q
            m = self.context_baseline(row, ctx, n, lim, loss)
        if n == 0.0:  # the first loss is the mean
            row[C_PSI] = loss
            return
        g_mant = gap_of(loss, m, &g_exp)
        if d_mant == 0.0:  # the first non-zero gap sets D; nothing was learned before
            if g_mant == 0.0:  # one more gap of 0 in the arm's mean
                self.arm_scale(row, arm, 0.0, True)
                return
            f = self.arm_scale(row, arm, 1.0, True)  # D = |gap|, then the mean over arms
            row[C_D_MANT] = frexp(fabs(g_mant) * f, &e)
            row[C_D_EXP] = g_exp + e
            if one_mean:
                row[C_PSI] = m + ldexp(g_mant / (n + 1.0), g_exp)
            if self.n_arms > 1:
                self.tsallis_estimate(row + C_HEAD + ctx * self.n_arms, arm, q, eta,
                                      copysign(1.0, g_mant) / (q * f))
            return
        full = floor(ldexp(g_mant / d_mant, g_exp - d_exp) * GRID + 0.5) / GRID  # gap / D
        f = self.arm_scale(row, arm, full, False)  # D'/D
        ratio = 1.0 / f
        if one_mean:  # the mean takes the gap as far as lim·D
            row[C_PSI] = m + ldexp(clamped(full, lim) * d_mant / (n + 1.0), d_exp)
        row[C_D_MANT] = frexp(d_mant * f, &e)
        row[C_D_EXP] = d_exp + e
        if self.n_arms == 1:
            return
        for i in range(self.n_state):
            row[C_HEAD + i] = row[C_HEAD + i] * ratio
        u = clamped(full * ratio, CUT)  # in units of D'; only the estimate is cut
        self.tsallis_estimate(row + C_HEAD + ctx * self.n_arms, arm, q, eta, u / q)

    cdef double arm_scale(self, double* row, int64_t arm, double x,
                          bint unscaled) noexcept nogil:
        """D'/D once the played arm's squared gap x² (x = gap/D) joins its mean. D² is the
        mean, over the arms with a gap so far, of each arm's mean squared gap (the last
        2·M + 1 columns: the number of arms with a gap, each arm's mean squared gap in
        units of D², each arm's count of gaps), so an arm that is not played keeps its
        weight in D: a run that plays only arms of constant loss does not shrink D, and
        the state (in units of D) does not push the others away. x² counts only as far as
        D at most doubles; the means are rescaled to D', so they sum to the number of arms
        with a gap, which stands for their sum (``unscaled``: D is not set yet, every mean
        is 0: their sum is 0)."""
        cdef Py_ssize_t i, m = self.n_arms
        cdef double* stats = row + self.width - 2 * m - 1
        cdef double* mean_sq = stats + 1
        cdef double* count = mean_sq + m
        cdef double k = count[arm], old = mean_sq[arm], played = stats[0], cap, total
        cdef double held = 0.0 if unscaled else played
        if k == 0.0:  # the arm joins the mean: (played - 1 + x²)/played <= 4
            played += 1.0
            cap = 3.0 * played + 1.0
        else:  # 1 + (x² - mean_sq)/((k + 1)·played) <= 4
            cap = old + 3.0 * played * (k + 1.0)
        stats[0], count[arm] = played, k + 1.0
        mean_sq[arm] = old + ((x * x if x * x < cap else cap) - old) / (k + 1.0)
        total = (held - old + mean_sq[arm]) / played
        if not (total > 0.0):  # every gap so far 0 in every arm: D stays
            return 1.0
        cap = 1.0 / total
        for i in range(m):
            mean_sq[i] = mean_sq[i] * cap
        return sqrt(total)

    cdef double context_baseline(self, double* row, int ctx, double n, double lim,
                                 double loss) noexcept nogil:
        """Several contexts: the baseline this loss's gap is taken from, the context's mean
        m_c shrunk towards the mean ψ of every loss, (k·m_c + P·ψ)/(k + P) with k the
        context's losses so far and P = ``TSALLIS_PRIOR`` (as ψ + (m_c - ψ)·k/(k + P): equal
        means give ψ exactly, so equal losses leave no gap); then ψ, m_c and k take the loss
        (``mean_step``, as far as D at most doubles; a context's first loss is its mean).
        A context's level is its own: gaps from one mean for contexts whose losses sit
        higher or lower would add (level difference)/q to every estimate, and a young
        context's own mean would add its noise."""
        cdef double* mean = row + C_HEAD + self.n_state + self.n_clocks + ctx
        cdef double k = mean[self.n_clocks], psi = row[C_PSI]
        cdef double base = psi + (mean[0] * 0.5 - psi * 0.5) * (2.0 * k / (k + PRIOR))
        cdef double d_mant = row[C_D_MANT]
        cdef int d_exp = <int>row[C_D_EXP]
        row[C_PSI] = loss if n == 0.0 else mean_step(psi, loss, n, d_mant, d_exp, lim)
        mean[0] = loss if k == 0.0 else mean_step(mean[0], loss, k, d_mant, d_exp, lim)
        mean[self.n_clocks] = k + 1.0
        return base

    cdef inline void tsallis_estimate(self, double* state, int64_t arm, double q, double eta,
                                      double est) noexcept nogil:
        """Φ_arm += est, kept above -c/(η̃·sqrt(q)), c = ``TSALLIS_LOW`` (c = 1 is the
        stability condition of Tsallis-INF's analysis for negative estimates). Above there
        is no bound: a rarely played arm's large loss counts in full."""
        cdef double low = -LOW / (eta * sqrt(q))
        state[arm] += est if est > low else low

    cdef void cumulative_update(self, double* state, int ctx, int64_t arm,
                                       const Step* s) noexcept nogil:
        """Identity transition: Φ/D of the played (context, arm) grows by φ/D."""
        cdef Py_ssize_t i
        if s.ratio != 1.0:
            for i in range(self.n_state):
                state[i] = state[i] * s.ratio
        state[ctx * self.n_arms + arm] += s.x

    cdef void switching_update(self, double* w, int64_t arm, const Step* s, double c,
                               double n) noexcept nogil:
        """Loss and power η_t/η_{t-1} in the log domain, then the fixed share
        w' = (1-α)z + α/(M-1)(Σz - z), normalised to sum 1 (M >= 2)."""
        cdef Py_ssize_t i, m = self.n_arms
        cdef double* e = &self.scratch[0]
        cdef double top, total, alpha, a, b, shared
        if s.active:  # log z = r·log w - η·φ·[arm], then z relative to its largest
            for i in range(m):
                e[i] = powered(tsi_log(w[i]), s, c * s.x, i == arm)
            top = e[0]
            for i in range(1, m):
                if e[i] > top:
                    top = e[i]
            for i in range(m):
                e[i] = tsi_exp(e[i] - top)
        else:  # η still infinite: only the transition moves the weights
            for i in range(m):
                e[i] = w[i]
        total = fixed_sum(e, m)
        alpha = self.rate if self.rate >= 0.0 else 1.0 / (n + 1.0)
        b = alpha / (m - 1)
        a = 1.0 - alpha - b
        for i in range(m):
            if a >= 0.0:  # both terms >= 0: no cancellation
                shared = a * e[i] + b * total
            else:
                shared = (1.0 - alpha) * e[i] + b * (total - e[i])
                shared = shared if shared > 0.0 else 0.0
            e[i] = shared
        total = fixed_sum(e, m)
        for i in range(m):
            w[i] = e[i] / total

    cdef void markov_update(self, double* logw, int64_t arm, const Step* s,
                            double c) noexcept nogil:
        """Loss and power per class, then w'_λ = Σ_μ T(λ|μ) z_μ as a log-sum-exp per target."""
        cdef Py_ssize_t i, j, e, k = self.n_classes
        cdef double* z = &self.scratch[0]
        cdef double term, top, total
        for i in range(k):
            z[i] = powered(logw[i], s, c * s.x, self.arm_of[i] == arm) if s.active else logw[i]
            logw[i] = -INFINITY
        for j in range(self.targets.shape[0]):
            top = -INFINITY
            for e in range(self.starts[j], self.starts[j + 1]):
                term = z[self.src[e]] + self.log_t[e]
                if term > top:
                    top = term
            if not isfinite(top):
                top = 0.0
            total = 0.0
            for e in range(self.starts[j], self.starts[j + 1]):
                total += tsi_exp(z[self.src[e]] + self.log_t[e] - top)
            logw[self.targets[j]] = tsi_log(total) + top
        normalise(logw, k)


cdef class Table:
    """Instances of one configuration as rows of a float64 array, and their rounds.

    Single-call entry points (``select``, ``update``, ``probabilities``) take one row;
    batch entry points (``select_many``, ``update_many``, ``probabilities_many``) process
    many events in order in one call (a row may appear several times). Arguments are
    checked (a bad row, context, arm, draw, probability or loss raises ``ValueError``
    before anything changes); the callers' richer checks come first.
    """

    def __init__(self, Kernel kernel, rows):
        cdef double[:, ::1] view
        if not isinstance(rows, np.ndarray) or rows.dtype != np.float64 or rows.ndim != 2 \
                or rows.shape[1] != kernel.width or not rows.flags.c_contiguous \
                or not rows.flags.writeable or rows.shape[0] < 1:
            raise ValueError(f"rows must be a writeable C-contiguous float64 array of shape "
                             f"(n >= 1, {kernel.width})")
        view = rows
        self.kernel, self.rows, self.n = kernel, rows, rows.shape[0]
        self.data = &view[0, 0]

    cdef double* row(self, Py_ssize_t i) except NULL:
        if i < 0 or i >= self.n:
            raise ValueError(f"row {i} is outside [0, {self.n - 1}]")
        return self.data + i * self.kernel.width

    cdef int check_context(self, int64_t ctx) except -1:
        if ctx < 0 or ctx >= self.kernel.n_contexts:
            raise ValueError(f"context {ctx} is outside [0, {self.kernel.n_contexts - 1}]")
        return 0

    cdef int check_ticket(self, int64_t ctx, int64_t arm, double q, double p,
                                 double loss) except -1:
        self.check_context(ctx)
        if arm < 0 or arm >= self.kernel.n_arms:
            raise ValueError(f"arm {arm} is outside [0, {self.kernel.n_arms - 1}]")
        if not (0.0 < q <= 1.0) or not (0.0 <= p <= 1.0):
            raise ValueError(f"q must be in (0, 1] and p in [0, 1], got q={q!r}, p={p!r}")
        if not isfinite(loss):
            raise ValueError(f"loss must be a finite real number, got {loss!r}")
        return 0

    cdef int check_mask(self, const unsigned char* mask, const Alloc* alloc) except -1:
        """An eligible mask (NULL: every arm) names at least one arm, and the forced arm."""
        cdef Py_ssize_t i, n = 0
        if mask == NULL:
            return 0
        for i in range(self.kernel.n_arms):
            n += mask[i] != 0
        if n == 0:
            raise ValueError("no eligible arm: a request needs at least one")
        if alloc.forced and not mask[alloc.force_arm]:
            arms = [a for a in range(self.kernel.n_arms) if mask[a]]
            raise ValueError(f"force_arm {alloc.force_arm} is not among the eligible arms {arms}")
        return 0

    cdef const unsigned char* mask_of(self, object eligible, Py_ssize_t rows,
                                      Py_ssize_t* stride) except? NULL:
        """The first byte of an eligible mask (1: eligible): None (NULL), M bytes (every
        row: ``stride`` 0) or rows·M bytes (``stride`` M), as a bytes-like object or a
        C-contiguous uint8 array of shape (M,) or (rows, M)."""
        cdef const unsigned char[::1] flat = None
        cdef Py_ssize_t m = self.kernel.n_arms
        stride[0] = 0
        if eligible is None:
            return NULL
        try:
            if isinstance(eligible, np.ndarray):
                if eligible.flags.c_contiguous and eligible.ndim <= 2:
                    flat = eligible.reshape(-1)  # a view: its buffer is the caller's
            else:
                flat = eligible
        except (TypeError, ValueError, BufferError):
            flat = None
        if flat is None or flat.shape[0] not in (m, rows * m):
            raise ValueError(f"an eligible mask must be {m} or {rows}×{m} bytes (uint8), "
                             f"got {eligible!r:.80}")
        if flat.shape[0] != m:
            stride[0] = m
        return &flat[0]

    def select(self, Py_ssize_t i, int64_t context, double u, allocation=None,
               eligible=None):
        """(arm, q, p, round, why) drawn for row ``i`` with the uniform draw ``u`` in
        [0, 1) under ``allocation`` (an ``Allocation``; None: none) among the arms of
        ``eligible`` (a mask of M bytes, ``mask_of``; None: all); ``q`` is the
        probability the arm was served with, ``round`` counts the row's selections from 1
        and ``why`` indexes ``WHYS``."""
        cdef int64_t arm
        cdef int why
        cdef double q, p
        cdef double* row = self.row(i)
        cdef Py_ssize_t stride
        cdef Alloc alloc = alloc_of(allocation, self.kernel.n_arms)
        cdef const unsigned char* mask = self.mask_of(eligible, 1, &stride)
        self.check_context(context)
        self.check_mask(mask, &alloc)
        if not (0.0 <= u < 1.0):
            raise ValueError(f"u must be a real number in [0, 1), got {u!r}")
        self.kernel.select_row(row, <int>context, u, &alloc, mask, &arm, &q, &p, &why)
        return arm, q, p, <int64_t>row[C_N_ROUNDS], why

    def update(self, Py_ssize_t i, int64_t context, int64_t arm, double q, double p,
               double loss):
        """Apply the loss of an arm served with probability q (weight share p)."""
        cdef double* row = self.row(i)
        self.check_ticket(context, arm, q, p, loss)
        self.kernel.update_row(row, <int>context, arm, q, p, loss)

    def probabilities(self, Py_ssize_t i, int64_t context, allocation=None,
                      eligible=None) -> np.ndarray:
        """The probability of each arm at row ``i``'s next selection in ``context``
        (a new array): the learner's q, or under ``allocation`` and ``eligible`` (as for
        ``select``) the probability P each arm would be served with."""
        out = np.empty(self.kernel.n_arms)
        cdef double[::1] view = out
        cdef double* row = self.row(i)
        cdef Py_ssize_t stride
        cdef Alloc alloc = alloc_of(allocation, self.kernel.n_arms)
        cdef const unsigned char* mask = self.mask_of(eligible, 1, &stride)
        self.check_context(context)
        self.check_mask(mask, &alloc)
        self.kernel.serving_row(row, <int>context, &alloc, mask, &view[0])
        return out

    def weight_shares(self, Py_ssize_t i, int64_t context) -> np.ndarray:
        """p = w/Σw of every arm for row ``i`` in ``context``: q before the ε-mixing."""
        out = np.empty(self.kernel.n_arms)
        cdef double[::1] view = out
        cdef double* row = self.row(i)
        cdef double total, scale, spread
        cdef Py_ssize_t a
        self.check_context(context)
        if self.kernel.tsallis:
            total = self.kernel.policy(row, <int>context, &view[0], &scale, &spread)
        else:
            total = self.kernel.arm_weights(row + C_HEAD, <int>context,
                                            self.kernel.eta_d(row[C_VN]), &view[0])
        for a in range(self.kernel.n_arms):
            view[a] = view[a] / total
        return out

    def select_many(self, const int64_t[::1] rows, const int64_t[::1] contexts,
                    const double[::1] u, int64_t[::1] arms, double[::1] q, double[::1] p,
                    int8_t[::1] why=None, allocation=None, eligible=None):
        """One selection per event, in order, into ``arms``, ``q``, ``p`` and ``why``
        (needed with an allocation or a mask), under ``allocation`` among the arms of
        ``eligible`` (None; a uint8 mask of M entries for every event; or one per event,
        shape (events, M))."""
        cdef Py_ssize_t e, n = rows.shape[0]
        cdef Py_ssize_t stride
        cdef int code
        cdef Alloc alloc = alloc_of(allocation, self.kernel.n_arms)
        cdef const unsigned char* mask = self.mask_of(eligible, n, &stride)
        self._check_lengths(n, contexts.shape[0], u.shape[0], arms.shape[0], q.shape[0],
                            p.shape[0])
        if why is not None:
            self._check_lengths(n, why.shape[0])
        elif alloc.active or mask != NULL:
            raise ValueError("why is required with an allocation or eligible arms")
        for e in range(n):
            self.row(rows[e])
            self.check_context(contexts[e])
            self.check_mask(row_mask(mask, e * stride), &alloc)
            if not (0.0 <= u[e] < 1.0):
                raise ValueError(f"u[{e}] = {u[e]!r} is not in [0, 1)")
        for e in range(n):
            self.kernel.select_row(self.data + rows[e] * self.kernel.width, <int>contexts[e],
                                   u[e], &alloc, row_mask(mask, e * stride),
                                   &arms[e], &q[e], &p[e], &code)
            if why is not None:
                why[e] = code

    def update_many(self, const int64_t[::1] rows, const int64_t[::1] contexts,
                    const int64_t[::1] arms, const double[::1] q, const double[::1] p,
                    const double[::1] losses):
        """Apply one loss per event, in order."""
        cdef Py_ssize_t e, n = rows.shape[0]
        self._check_lengths(n, contexts.shape[0], arms.shape[0], q.shape[0], p.shape[0],
                            losses.shape[0])
        for e in range(n):
            self.row(rows[e])
            self.check_ticket(contexts[e], arms[e], q[e], p[e], losses[e])
        for e in range(n):
            self.kernel.update_row(self.data + rows[e] * self.kernel.width, <int>contexts[e],
                                   arms[e], q[e], p[e], losses[e])

    def probabilities_many(self, const int64_t[::1] rows, const int64_t[::1] contexts,
                           allocation=None, eligible=None):
        """The probabilities of each event's next selection, shape (events, M): the
        learner's q, or P under ``allocation`` and ``eligible`` (as for ``select_many``)."""
        cdef Py_ssize_t e, n = rows.shape[0]
        cdef Py_ssize_t stride
        cdef Alloc alloc = alloc_of(allocation, self.kernel.n_arms)
        cdef const unsigned char* mask = self.mask_of(eligible, n, &stride)
        self._check_lengths(n, contexts.shape[0])
        out = np.empty((n, self.kernel.n_arms))
        cdef double[:, ::1] view = out
        for e in range(n):
            self.row(rows[e])
            self.check_context(contexts[e])
            self.check_mask(row_mask(mask, e * stride), &alloc)
        for e in range(n):
            self.kernel.serving_row(self.data + rows[e] * self.kernel.width, <int>contexts[e],
                                    &alloc, row_mask(mask, e * stride), &view[e, 0])
        return out

    def _check_lengths(self, Py_ssize_t n, *others):
        for other in others:
            if other != n:
                raise ValueError(f"every event array must have {n} entries, got {other}")
