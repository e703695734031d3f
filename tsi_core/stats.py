"""Scale-free running statistics of the algorithm: ψ, V, D and the learning rate η.

The paper's quantities overflow or underflow in float64 long before the losses do
(``V`` sums squares of importance-weighted losses). They are kept here in a form that is
exact under rescaling:

* ``D = d_mant · 2**d_exp`` with ``d_mant`` in [0.5, 1) (or 0 while no positive φ was seen),
* ``vn = V / D²`` (the second moment measured in units of the current range ``D``).

Every quantity the weights need is a ratio of these: ``η·φ = γ·x / sqrt(vn + 1)`` with
``x = φ / D``, and ``η_t / η_{t-1} = (D_{t-1}/D_t)·sqrt((vn_{t-1}+1)/(vn_t+1))``.
Multiplying every loss by ``2**k`` only shifts exponents, so decisions are bit-identical.

``observe`` works on Python floats (one instance); ``observe_batch`` does the same
operations, in the same order, on numpy arrays (many instances).

>>> step = observe(psi=1.0, vn=0.0, d_mant=0.0, d_exp=0, loss=3.0, q=0.5, p=0.5)
>>> step.x, step.ratio, step.vn       # φ = (3 - 1)/0.5 = 4 becomes the range D
(1.0, 0.0, 0.5)
>>> math.ldexp(step.d_mant, step.d_exp)
4.0
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np


class Step(NamedTuple):
    """Result of observing one loss: the new statistics and the update's coefficients."""

    psi: float
    vn: float
    d_mant: float
    d_exp: int
    x: float  # φ / D_new, in [0, 1]
    ratio: float  # D_old / D_new (1.0 while D_new is 0)
    r: float  # η_new / η_old (0.0 when η_old was +inf)
    active: bool  # D_new > 0: η is finite and the loss term applies


def exploration(n_arms: int, t: int) -> float:
    """ε_t = min(1/2, sqrt(M/t)), the paper's uniform mixture coefficient.

    >>> exploration(4, 1), exploration(4, 64)
    (0.5, 0.25)
    """
    return min(0.5, math.sqrt(n_arms / t))


def _scaled_gap(loss: float, psi: float) -> tuple[float, int]:
    """(mantissa, exponent) of loss - psi >= 0, without overflow for any finite inputs."""
    gap = loss - psi
    if math.isinf(gap):
        mant, exp = math.frexp(loss * 0.5 - psi * 0.5)
        return mant, exp + 1
    return math.frexp(gap)


def observe(
    psi: float, vn: float, d_mant: float, d_exp: int, loss: float, q: float, p: float
) -> Step:
    """Fold one observed loss (drawn with probability ``q``, policy mass ``p``) into the stats."""
    new_psi = loss if loss < psi else psi
    g_mant, g_exp = _scaled_gap(loss, new_psi)
    if g_mant == 0.0:  # φ = 0: nothing but ψ can change
        if d_mant == 0.0:
            return Step(new_psi, vn, d_mant, d_exp, 0.0, 1.0, 1.0, False)
        return Step(new_psi, vn, d_mant, d_exp, 0.0, 1.0, 1.0, True)
    phi_mant, phi_exp = math.frexp(g_mant / q)
    phi_exp += g_exp
    if d_mant == 0.0 or phi_exp > d_exp or (phi_exp == d_exp and phi_mant > d_mant):
        ratio = 0.0 if d_mant == 0.0 else math.ldexp(d_mant / phi_mant, d_exp - phi_exp)
        new_vn = vn * ratio * ratio + p
        x = 1.0
        d_mant, d_exp = phi_mant, phi_exp
    else:
        ratio = 1.0
        x = math.ldexp(phi_mant / d_mant, phi_exp - d_exp)
        new_vn = vn + p * x * x
    r = ratio * math.sqrt((vn + 1.0) / (new_vn + 1.0))
    return Step(new_psi, new_vn, d_mant, d_exp, x, ratio, r, True)


class BatchStep(NamedTuple):
    """``Step`` for many instances at once (each field an array)."""

    psi: np.ndarray
    vn: np.ndarray
    d_mant: np.ndarray
    d_exp: np.ndarray
    x: np.ndarray
    ratio: np.ndarray
    r: np.ndarray
    active: np.ndarray


def observe_batch(
    psi: np.ndarray,
    vn: np.ndarray,
    d_mant: np.ndarray,
    d_exp: np.ndarray,
    loss: np.ndarray,
    q: np.ndarray,
    p: np.ndarray,
) -> BatchStep:
    """Vectorised ``observe``: the same operations in the same order, elementwise."""
    with np.errstate(over="ignore", invalid="ignore"):
        new_psi = np.minimum(psi, loss)
        gap = loss - new_psi
        g_mant, g_exp = np.frexp(gap)
        big = np.isinf(gap)
        if big.any():
            h_mant, h_exp = np.frexp(loss[big] * 0.5 - new_psi[big] * 0.5)
            g_mant[big], g_exp[big] = h_mant, h_exp + 1
    phi_mant, phi_exp = np.frexp(g_mant / q)
    phi_exp = phi_exp.astype(np.int64) + g_exp
    positive = g_mant != 0.0
    grows = positive & (
        (d_mant == 0.0) | (phi_exp > d_exp) | ((phi_exp == d_exp) & (phi_mant > d_mant))
    )
    # most rounds keep D: compute that case for all, then redo the few where D grows
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        x = np.ldexp(phi_mant / d_mant, phi_exp - d_exp)
    x[~positive] = 0.0
    new_vn = vn + p * x * x
    ratio = np.ones_like(vn)
    new_d_mant, new_d_exp = d_mant.copy(), d_exp.copy()
    grown = np.flatnonzero(grows)
    if len(grown):
        old_mant, old_exp, new_mant = d_mant[grown], d_exp[grown], phi_mant[grown]
        with np.errstate(under="ignore"):
            ratio[grown] = np.ldexp(old_mant / new_mant, old_exp - phi_exp[grown])  # 0 if D was 0
        x[grown] = 1.0
        new_vn[grown] = vn[grown] * ratio[grown] * ratio[grown] + p[grown]
        new_d_mant[grown], new_d_exp[grown] = new_mant, phi_exp[grown]
    r = ratio * np.sqrt((vn + 1.0) / (new_vn + 1.0))
    r[~positive] = 1.0
    return BatchStep(new_psi, new_vn, new_d_mant, new_d_exp, x, ratio, r, new_d_mant != 0.0)
