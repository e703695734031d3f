# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, embedsignature=True
"""The hot path of one bandit instance: select and update, with their checks, compiled.

``tsi_core.bandit.Bandit`` subclasses ``BanditCore`` and adds configuration, statistics
and persistence in Python. A round here is: check the arguments (the same rules and
messages as ``tsi_core.validate``), call the kernel on the instance's row, build or settle
the ``Ticket``. The instance's own uniform draws come straight from its numpy generator's
C interface: the same numbers ``Generator.random()`` returns.
"""

from cpython.object cimport PyObject, PyTypeObject
from cpython.pycapsule cimport PyCapsule_GetPointer
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_SET_ITEM
from libc.math cimport isfinite
from libc.stdint cimport int64_t, uint64_t

import numpy as np

from tsi_core._kernel cimport (
    C_N_ROUNDS, WHY_FORCED, Alloc, Kernel, Table, alloc_of,
)
from tsi_core._kernel import WHYS
from tsi_core._packing cimport packed_row, row_from_bytes
from tsi_core.allocation import Allocation, eligible_mask
from tsi_core.ticket import Ticket, TicketError
from tsi_core.validate import check_draw, check_loss, context_problem

cdef tuple _WHYS = WHYS
cdef str _FORCED = WHYS[WHY_FORCED]
cdef object _PLAIN = Allocation()


cdef extern from *:
    """
    /* numpy/random/bitgen.h: the C interface every numpy BitGenerator exposes */
    typedef struct {
        void *state;
        uint64_t (*next_uint64)(void *st);
        uint32_t (*next_uint32)(void *st);
        double (*next_double)(void *st);
        uint64_t (*next_raw)(void *st);
    } tsi_bitgen_t;
    """
    ctypedef struct tsi_bitgen_t:
        void* state
        double (*next_double)(void* st) noexcept nogil

cdef extern from "Python.h":
    object PyType_GenericAlloc(PyTypeObject* type, Py_ssize_t n)
    bint PyObject_GC_IsTracked(object op)
    void PyObject_GC_UnTrack(void* op)


cdef inline void put(object ticket, Py_ssize_t i, object item):
    Py_INCREF(item)  # PyTuple_SET_ITEM steals a reference
    PyTuple_SET_ITEM(ticket, i, item)


cdef inline object new_ticket(object instance, int64_t round_, int64_t arm, double q,
                              double p, object context, int why):
    """Ticket(instance, round_, arm, q, p, context, WHYS[why]), allocated as
    tuple.__new__ does for a tuple subclass, without the intermediate tuple."""
    cdef object ticket = PyType_GenericAlloc(<PyTypeObject*>Ticket, 7)
    put(ticket, 0, instance)
    put(ticket, 1, round_)
    put(ticket, 2, arm)
    put(ticket, 3, q)
    put(ticket, 4, p)
    put(ticket, 5, context)
    put(ticket, 6, <object>PyTuple_GET_ITEM(_WHYS, why))
    return ticket


#: the type of each field of a ticket whose table the cyclic GC need not walk (``_atomic``)
cdef tuple _ATOMIC = (str, int, int, float, float, int, str)


cdef inline bint _atomic(object ticket):
    """Whether a ticket holds only strs, ints, floats and None (its context): then a table
    of such tickets cannot be part of a reference cycle, and is kept out of the cyclic GC's
    walks (CPython tracks a dict from the first tuple subclass put in it, tracked or
    not; an instance with many pending tickets kept one such dict walked at every
    collection)."""
    cdef Py_ssize_t i
    for i in range(7):
        item = field(ticket, i)
        if type(item) is not <object>PyTuple_GET_ITEM(_ATOMIC, i) and not (i == 5 and item is None):
            return False
    return True


cdef inline bint _table(object held) noexcept:
    """Whether an instance's pending tickets are held in a table (a dict by round), not
    as one ticket or none."""
    return type(held) is dict


cdef inline object field(object ticket, Py_ssize_t i):
    """Item i of a Ticket (a tuple): no __getitem__ dispatch."""
    return <object>PyTuple_GET_ITEM(ticket, i)


def unpacked(type cls, blob, BanditCore template, instance_id):
    """A ``cls`` instance from ``BanditCore._packed`` bytes of any release, configured as
    ``template`` (``Bandit.unpack`` without its pending tickets); ValueError for bytes of
    another layout or size or values no instance can hold (``_packing.row_from_bytes``)."""
    cdef Kernel kernel = template._kernel
    rows = np.empty((1, kernel.width))
    cdef double[:, ::1] view = rows
    cdef double* row = &view[0, 0]
    row_from_bytes(kernel, blob, row, template.structure.state_shape)
    made = cls.__new__(cls)  # the subclass's own fields (Bandit's slots) set by name
    made.n_arms, made.structure = template.n_arms, template.structure
    made.gamma, made.competition = template.gamma, template.competition
    made.variant = template.variant
    cdef BanditCore bandit = made
    bandit._seed, bandit.instance_id = template._seed, instance_id
    bandit._allocation, bandit._alloc = template._allocation, template._alloc
    cdef Table table = Table.__new__(Table)
    table.kernel, table.rows, table.n, table.data = kernel, rows, 1, row
    bandit.attach(table)
    return bandit


cdef class BanditCore:
    """Row 0 of a one-row kernel table, the pending tickets, the instance's draws, and
    its allocation (``tsi_core.allocation``: configuration, not learned state)."""

    cdef readonly Table _table
    cdef readonly object _row
    cdef double* _data
    cdef Kernel _kernel
    cdef int _n_contexts
    cdef public object instance_id
    cdef public object _pending      # None, one Ticket, or {round: Ticket}
    cdef public object _seed
    cdef public object _rng_state    # a restored generator state, used on first draw
    cdef object _generator
    cdef object _bit_generator      # keeps the C state below alive
    cdef tsi_bitgen_t* _bitgen
    cdef readonly object _allocation  # None: Allocation(), the learner's q as it is
    cdef Alloc _alloc

    @property
    def allocation(self):
        """How traffic is allocated around the learner (``Allocation``); setting it is a
        live edit, checked against the arms, and changes no learned state."""
        return _PLAIN if self._allocation is None else self._allocation

    @allocation.setter
    def allocation(self, allocation):
        if allocation is None:
            allocation = _PLAIN
        self._alloc = alloc_of(allocation, self._kernel.n_arms)  # checks it first
        self._allocation = None if allocation.plain else allocation

    def _attach(self, Table table):
        """Make ``table`` (one row) this instance's state."""
        self.attach(table)

    cdef int attach(self, Table table) except -1:
        if table.n != 1:
            raise ValueError(f"an instance's table has one row, got {table.n}")
        self._table, self._kernel, self._row = table, table.kernel, table.rows[0]
        self._data = table.row(0)
        self._n_contexts = table.kernel.n_contexts
        return 0

    def _packed(self) -> bytes:
        """The row as bytes in the layout ``tsi_core._packing`` describes (``unpacked``
        reads them back)."""
        return packed_row(self._kernel, self._data)

    # ------------------------------------------------------------------ draws
    @property
    def _rng(self):
        """The instance's own generator, created on first use (streams pass their own u)."""
        if self._generator is None:
            generator = np.random.default_rng(self._seed)
            if self._rng_state is not None:
                generator.bit_generator.state = self._rng_state
            self._bit_generator = generator.bit_generator
            capsule = self._bit_generator.capsule
            self._bitgen = <tsi_bitgen_t*>PyCapsule_GetPointer(capsule, "BitGenerator")
            self._generator = generator
        return self._generator

    @property
    def _rng_obj(self):
        return self._generator

    cdef double _draw(self) except? -1.0:
        if self._bitgen == NULL:
            self._rng
        return self._bitgen.next_double(self._bitgen.state)

    # -------------------------------------------------------------- decisions
    def select(self, context=None, u=None, eligible=None):
        """Draw an arm; ``u`` in [0, 1) replaces the instance's own uniform draw;
        ``eligible`` (arm indices or a boolean mask; None: all) the arms that may be
        served. The ticket's ``prob`` is the probability the arm was served with."""
        cdef int64_t arm
        cdef int64_t row = 0
        cdef int why
        cdef double q, p, draw
        cdef const unsigned char[::1] view
        cdef const unsigned char* mask = NULL
        if type(context) is int and 0 <= context < self._n_contexts and self._n_contexts > 1:
            row = context  # the common contextual case, checked here without a call
        elif context is not None or self._n_contexts > 1:
            problem = context_problem(self._n_contexts, context)
            if problem is not None:
                raise ValueError(problem)
            row = context
        if eligible is not None:
            given = eligible_mask(eligible, self._kernel.n_arms)
            if given is not None:
                view = given
                mask = &view[0]
                self._table.check_mask(mask, &self._alloc)
        if u is None:
            draw = self._draw()
        elif isinstance(u, float) and 0.0 <= <double>u < 1.0:
            draw = u
        else:
            draw = check_draw(u)
        self._kernel.select_row(self._data, <int>row, draw, &self._alloc, mask, &arm, &q, &p,
                                &why)
        ticket = new_ticket(self.instance_id, <int64_t>self._data[C_N_ROUNDS], arm, q, p,
                            context, why)
        self.hold(ticket)
        return ticket

    def update(self, ticket, loss):
        """Apply the loss of a ticket's arm; each ticket exactly once, in any order. The
        update uses the probability the arm was served with (the ticket's ``prob``); a
        ticket served because an arm was forced is settled and teaches nothing."""
        cdef double value
        self.check_pending(ticket)
        if isinstance(loss, float) and isfinite(<double>loss):
            value = loss
        else:
            value = check_loss(loss)
        context = field(ticket, 5)
        cdef int64_t row = 0 if context is None else context
        cdef int64_t arm = field(ticket, 2)
        cdef double q = field(ticket, 3)
        cdef double p = field(ticket, 4)
        self._table.check_ticket(row, arm, q, p, value)
        why = field(ticket, 6)
        if why is not _FORCED and why != _FORCED:
            self._kernel.update_row(self._data, <int>row, arm, q, p, value)
        self.settle(ticket)

    def discard(self, ticket):
        """Forget a pending ticket without feedback (its time to live ran out)."""
        self.check_pending(ticket)
        self.settle(ticket)

    # -------------------------------------------------------- pending tickets
    @property
    def pending(self):
        """Tickets selected and not yet updated or discarded."""
        held = self._pending
        if held is None:
            return ()
        if _table(held):
            return tuple(held.values())
        return (held,)

    def _hold(self, ticket):
        """Hold a ticket from outside (a restore, a migration); ``select`` holds its own."""
        if not isinstance(ticket, Ticket):
            raise TicketError(f"expected a Ticket, got {ticket!r}")
        self.hold(ticket)

    def _pending_at(self, round_):
        return self.pending_at(round_)

    cdef int hold(self, ticket) except -1:
        held = self._pending
        if held is None:
            self._pending = ticket  # the common case of one pending ticket needs no table
        elif _table(held):
            tracked = PyObject_GC_IsTracked(held)
            (<dict>held)[field(ticket, 1)] = ticket
            if not tracked and _atomic(ticket):
                PyObject_GC_UnTrack(<PyObject*>held)
        else:
            table = {field(held, 1): held, field(ticket, 1): ticket}
            if _atomic(held) and _atomic(ticket):
                PyObject_GC_UnTrack(<PyObject*>table)
            self._pending = table
        return 0

    cdef int settle(self, ticket) except -1:
        """Forget a pending ticket (``check_pending`` passed): back to no table when one
        is left."""
        held = self._pending
        if not _table(held):
            self._pending = None  # an idle instance keeps no ticket table
            return 0
        del (<dict>held)[field(ticket, 1)]
        if len(<dict>held) == 1:
            for one in (<dict>held).values():
                self._pending = one
        return 0

    cdef object pending_at(self, round_):
        held = self._pending
        if held is None:
            return None
        if _table(held):
            return held.get(round_)
        return held if held[1] == round_ else None

    cdef int check_pending(self, ticket) except -1:
        if not isinstance(ticket, Ticket):
            raise TicketError(f"expected a Ticket, got {ticket!r}")
        if field(ticket, 0) != self.instance_id:
            raise TicketError(
                f"ticket of instance {ticket[0]!r} given to instance {self.instance_id!r}"
            )
        held = self._pending
        if held is ticket or (
            _table(held) and (<dict>held).get(field(ticket, 1)) is ticket
        ):
            return 0  # the ticket it handed out (the common case: no comparison)
        if self.pending_at(field(ticket, 1)) != ticket:
            raise TicketError(
                f"ticket round {ticket[1]} is not pending here "
                "(already updated, discarded, never issued, or altered)"
            )
        return 0
