"""The references ``bench_core.py`` compares ``tsi_core`` against: EXP3 in plain Python, in
numpy (one instance and vectorised over N) and river's ``Exp3``."""

from __future__ import annotations

import bisect
import itertools
import math
import random
import time

import numpy as np


class Exp3:
    """Plain EXP3 on one instance: log-weights, softmax, searchsorted draw, IW update."""

    def __init__(self, n_arms: int, horizon: int, seed: int) -> None:
        self.logw = np.zeros(n_arms)
        self.eta = math.sqrt(2.0 * math.log(n_arms) / (horizon * n_arms))
        self.rng = np.random.default_rng(seed)

    def run(self, table: list, start: int, rounds: int) -> float:
        logw, eta, rng = self.logw, self.eta, self.rng
        last, n_rows = logw.shape[0] - 1, len(table)
        t0 = time.perf_counter()
        for i in range(start, start + rounds):
            w = np.exp(logw - logw.max())
            p = w / w.sum()
            u = rng.random()
            arm = min(int(np.searchsorted(np.cumsum(p), u, side="right")), last)
            logw[arm] -= eta * table[i % n_rows][arm] / p[arm]
        return time.perf_counter() - t0


class PythonExp3:
    """EXP3 in plain Python floats (math.exp, bisect): what CPython manages at its leanest."""

    def __init__(self, n_arms: int, horizon: int, seed: int) -> None:
        self.logw = [0.0] * n_arms
        self.eta = math.sqrt(2.0 * math.log(n_arms) / (horizon * n_arms))
        self.rng = random.Random(seed)

    def run(self, table: list, start: int, rounds: int) -> float:
        logw, eta, draw = self.logw, self.eta, self.rng.random
        last, n_rows = len(logw) - 1, len(table)
        t0 = time.perf_counter()
        for i in range(start, start + rounds):
            top = max(logw)
            w = [math.exp(v - top) for v in logw]
            total = sum(w)
            arm = min(bisect.bisect_right(list(itertools.accumulate(w)), draw() * total), last)
            logw[arm] -= eta * table[i % n_rows][arm] * total / w[arm]
        return time.perf_counter() - t0


# --------------------------------------------------------------------------- batch loops


class BatchExp3:
    """EXP3 vectorised over N independent instances (same steps as ``Exp3``, row-wise)."""

    def __init__(self, n_instances: int, n_arms: int, horizon: int, seed: int) -> None:
        self.logw = np.zeros((n_instances, n_arms))
        self.eta = math.sqrt(2.0 * math.log(n_arms) / (horizon * n_arms))
        self.rng = np.random.default_rng(seed)

    def run(self, losses: np.ndarray, start: int, rounds: int) -> float:
        logw, eta, rng = self.logw, self.eta, self.rng
        n, m = logw.shape
        idx = np.arange(n)
        n_slabs = len(losses)
        t0 = time.perf_counter()
        for r in range(start, start + rounds):
            w = np.exp(logw - logw.max(axis=1, keepdims=True))
            p = w / w.sum(axis=1, keepdims=True)
            u = rng.random(n)
            arms = np.minimum((np.cumsum(p, axis=1) <= u[:, None]).sum(axis=1), m - 1)
            logw[idx, arms] -= eta * losses[r % n_slabs][idx, arms] / p[idx, arms]
        return time.perf_counter() - t0


def river_exp3() -> type | None:
    try:
        from river.bandit import Exp3 as RiverExp3
    except ImportError:
        return None
    return RiverExp3
