# cython: language_level=3
"""C-level declarations of the kernel (``_kernel.pyx``), for other compiled modules."""

from libc.stdint cimport int64_t

cdef enum:
    # the columns of an instance's row; the class's state follows from C_HEAD
    C_PSI = 0
    C_VN = 1
    C_D_MANT = 2
    C_D_EXP = 3
    C_N_UPDATES = 4
    C_N_ROUNDS = 5
    C_HEAD = 6

cdef enum Kind:
    CUMULATIVE = 0
    SWITCHING = 1
    MARKOV = 2

cdef enum Why:
    # why a selection's arm was served (``WHYS`` names them)
    WHY_BANDIT = 0
    WHY_HOLDOUT = 1
    WHY_BURN_IN = 2
    WHY_FORCED = 3

cdef struct Alloc:
    # an ``Allocation`` as the round reads it; all zero: none (the learner's q as it is)
    bint active          # any setting below applies
    double min_share     # f: π_a = f + (1 - M_e·f)·q̃_a
    double holdout_share  # s (0: no holdout)
    int64_t holdout_arm
    double burn_in       # selections served uniformly (a count)
    bint forced
    int64_t force_arm

cdef struct Serving:
    # one request's base distribution π over the eligible arms, and its holdout
    int n_eligible
    bint uniform        # π = 1/M_e (burn-in, or q̃ underflowed)
    double scale        # q_i = w_i·scale + spread
    double spread
    double norm         # Σ q over E (1: E is every arm, q̃ = q)
    double floor        # f
    double keep         # 1 - M_e·f
    double share        # the holdout's s for this request (0 when none or not eligible)
    int64_t holdout_arm
    int why             # the base distribution's reason: bandit or burn-in

cdef Alloc alloc_of(object allocation, int n_arms) except *

cdef struct Step:
    double psi
    double vn
    double d_mant
    double d_exp
    double x       # φ / D_new, in [-1, 1] (>= 0 with the running-minimum baseline)
    double ratio   # D_old / D_new (1 while D does not grow, 0 when D was 0)
    double r       # η_new / η_old (0 when η_old was +inf)
    bint active    # D_new > 0: η is finite and the loss term applies


cdef class Kernel:
    cdef readonly int n_arms
    cdef readonly int n_contexts
    cdef readonly int n_state
    cdef readonly int n_clocks        # Tsallis, C > 1: C (a clock, a mean, a count each); else 0
    cdef readonly int n_arm_stats     # Tsallis: M (arms with a gap; each arm's mean square, count)
    cdef readonly int width
    cdef readonly double gamma
    cdef readonly str kind_name
    cdef readonly bint mean_baseline  # losses centred on their running mean, not minimum
    cdef readonly bint adaptive       # γ_t = γ·((V + D²)/V)^¼
    cdef readonly double step_cap     # |η·φ| <= step_cap per update (+inf: no cap)
    cdef readonly int growth          # D grows by at most 2^growth per update (-1: no bound)
    cdef readonly bint tsallis        # cumulative kinds: ½-Tsallis-INF on gaps in units of D
    cdef readonly bint grid           # the mean baseline's φ/D read on a grid (bobw's classes)
    cdef int kind
    cdef double rate
    cdef int n_classes
    cdef int64_t[::1] arm_of
    cdef int64_t[::1] src
    cdef int64_t[::1] targets
    cdef int64_t[::1] starts
    cdef double[::1] log_t
    cdef double[::1] scratch
    cdef double[::1] initial

    cdef double eta_d(self, double vn) noexcept nogil
    cdef str state_problem_of(self, const double* state)
    cdef str clocks_problem_of(self, const double* clocks)
    cdef void fill_clocks(self, double vn, double* clocks) noexcept nogil
    cdef str means_problem_of(self, const double* block, double n_updates)
    cdef void fill_means(self, double psi, double* block) noexcept nogil
    cdef str arm_stats_problem_of(self, const double* stats, double n_updates)
    cdef void fill_arm_stats(self, bint scaled, double* stats) noexcept nogil
    cdef double arm_scale(self, double* row, int64_t arm, double x,
                          bint unscaled) noexcept nogil
    cdef double context_baseline(self, double* row, int ctx, double n, double lim,
                                 double loss) noexcept nogil
    cdef double tsallis_eta(self, const double* row, int ctx) noexcept nogil
    cdef double arm_weights(self, const double* state, int ctx, double c,
                            double* w) noexcept nogil
    cdef double mixing(self, const double* row) noexcept nogil
    cdef double tsallis_weights(self, const double* row, int ctx, double* w) noexcept nogil
    cdef void tsallis_update(self, double* row, int ctx, int64_t arm, double q,
                             double loss) noexcept nogil
    cdef void tsallis_estimate(self, double* state, int64_t arm, double q, double eta,
                               double est) noexcept nogil
    cdef double policy(self, const double* row, int ctx, double* w, double* scale,
                       double* spread) noexcept nogil
    cdef void select_row(self, double* row, int ctx, double u, const Alloc* alloc,
                         const unsigned char* mask, int64_t* arm, double* q, double* p,
                         int* why) noexcept nogil
    cdef double serving(self, const double* row, int ctx, const Alloc* alloc,
                        const unsigned char* mask, double* w, Serving* sv) noexcept nogil
    cdef void policy_row(self, const double* row, int ctx, double* out) noexcept nogil
    cdef void serving_row(self, const double* row, int ctx, const Alloc* alloc,
                          const unsigned char* mask, double* out) noexcept nogil
    cdef void update_row(self, double* row, int ctx, int64_t arm, double q, double p,
                         double loss) noexcept nogil
    cdef void cumulative_update(self, double* state, int ctx, int64_t arm,
                                const Step* s) noexcept nogil
    cdef void switching_update(self, double* logw, int64_t arm, const Step* s, double c,
                               double n) noexcept nogil
    cdef void markov_update(self, double* logw, int64_t arm, const Step* s,
                            double c) noexcept nogil


cdef class Table:
    cdef readonly Kernel kernel
    cdef readonly object rows
    cdef double* data
    cdef readonly Py_ssize_t n

    cdef double* row(self, Py_ssize_t i) except NULL
    cdef int check_context(self, int64_t ctx) except -1
    cdef int check_mask(self, const unsigned char* mask, const Alloc* alloc) except -1
    cdef const unsigned char* mask_of(self, object eligible, Py_ssize_t rows,
                                      Py_ssize_t* stride) except? NULL
    cdef int check_ticket(self, int64_t ctx, int64_t arm, double q, double p,
                          double loss) except -1
