"""Peer libraries' bandit algorithms behind the ``BatchBandit`` interface, for the arena.

Each adapter runs N independent instances, one peer object per instance, looping in Python
(``base.PeerBatch`` says how: rewards, seeds, probabilities, failures). One module per
library: ``river_peer``, ``smpybandits_peer``, ``vw_peer``, ``mabwiser_peer``; a library is
imported on first use, not with this package (versions and quirks in arena/PEERS.md).

>>> [cls.name for cls in PEERS][:3]
['river Exp3', 'SMPyBandits Exp3', 'SMPyBandits Exp3S']
"""

from __future__ import annotations

from arena.peers.base import (
    INSTALL_HINT,
    KINDS,
    Failure,
    NumericWarning,
    PeerBatch,
    PeerFaultError,
)
from arena.peers.mabwiser_peer import MABWiserEpsilonGreedy, MABWiserSoftmax, MABWiserUCB1
from arena.peers.river_peer import RiverExp3
from arena.peers.smpybandits_peer import SMPyExp3, SMPyExp3S, SMPyTsallisInf
from arena.peers.vw_peer import VWCbExplore, VWCbExploreADF

__all__ = [
    "INSTALL_HINT",
    "KINDS",
    "PEERS",
    "Failure",
    "MABWiserEpsilonGreedy",
    "MABWiserSoftmax",
    "MABWiserUCB1",
    "NumericWarning",
    "PeerBatch",
    "PeerFaultError",
    "RiverExp3",
    "SMPyExp3",
    "SMPyExp3S",
    "SMPyTsallisInf",
    "VWCbExplore",
    "VWCbExploreADF",
    "available_peers",
    "missing_peers",
]

PEERS: tuple[type[PeerBatch], ...] = (
    RiverExp3,
    SMPyExp3,
    SMPyExp3S,
    SMPyTsallisInf,
    VWCbExplore,
    VWCbExploreADF,
    MABWiserSoftmax,
    MABWiserEpsilonGreedy,
    MABWiserUCB1,
)


def _import_errors() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for cls in PEERS:
        try:
            cls._load()
            out[cls.name] = None
        except Exception as exc:
            out[cls.name] = f"{type(exc).__name__}: {exc}"
    return out


def available_peers() -> dict[str, type[PeerBatch]]:
    """name -> adapter class, for the peers whose library imports."""
    errors = _import_errors()
    return {cls.name: cls for cls in PEERS if errors[cls.name] is None}


def missing_peers() -> dict[str, str]:
    """name -> import error text, for the peers whose library does not import."""
    return {name: err for name, err in _import_errors().items() if err is not None}
