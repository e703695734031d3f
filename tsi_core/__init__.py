"""tsi_core: the translation- and scale-invariant adversarial bandit (numpy only, no I/O).

>>> from tsi_core import Bandit, Switching
>>> b = Bandit(n_arms=5, competition=Switching(rate=1e-3), seed=7)
>>> sel = b.select()
>>> b.update(sel, loss=12.5)
"""

from tsi_core.allocation import Allocation
from tsi_core.bandit import Bandit, TicketError
from tsi_core.batch import BatchBandit, TicketBatch
from tsi_core.competition import Contextual, Fixed, Markov, Switching, competition_from_dict
from tsi_core.migrate import Migration, migrate, remap_ticket
from tsi_core.ticket import Ticket
from tsi_core.variant import VARIANTS, Variant

__all__ = [
    "VARIANTS",
    "Allocation",
    "Bandit",
    "BatchBandit",
    "Contextual",
    "Fixed",
    "Markov",
    "Migration",
    "Switching",
    "Ticket",
    "TicketBatch",
    "TicketError",
    "Variant",
    "competition_from_dict",
    "migrate",
    "remap_ticket",
]
