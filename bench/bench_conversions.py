"""Experiments as traffic teams run them: a conversion stream where feedback
comes only for conversions, with and without ``default_loss``; and a holdout's share
against the ``prob`` the service logs.

Run from the repository root::

    .venv/bin/python bench/bench_conversions.py                 # 10 seeds of 10^5 requests
    .venv/bin/python bench/bench_conversions.py --seeds 2 --requests 5000 --holdout 20000

How long it takes: bench/RESULTS.md, "Experiments as traffic teams run them".

Everything runs through the service's own dataflow (``flows.service.dataflow.build_flow``,
event time, one worker, in this process) in the closed loop of ``tsi demo``
(``flows.tools.demo.Loop``): each request is answered by the service before the next one
is sent, and the feedback the answer causes is queued at its own (later) event time, so
the run is what a live service would have seen.

**Conversions.** 5 arms convert with the probabilities ``RATES`` ("c6" is the best).
A request arrives every second of event time; a conversion sends ``{"loss": 0}`` after an
exponential delay of a minute, a non-conversion sends nothing; ``feedback_ttl`` is 10
minutes. The convention is "loss 1 = no conversion": (a) without ``default_loss`` every
loss the bandit sees is 0, (b) with ``default_loss = 1`` a window that ends without a
conversion teaches a loss of 1. Reported per configuration, averaged over the seeds: the
share of traffic the best arm gets in each tenth of the stream, the conversion rate of the
arms served (their expected rate, not the draws), and the regret against the best arm,
Σ (best rate − rate of the arm served), beside uniform traffic's T·(best − mean rate).

**Holdout.** ``holdout = {arm = "c2", share = 0.1}`` with ``min_share = 0.02``, the same
conversions and ``default_loss``, over ``--holdout`` requests (10^5 by default): the share
of requests the service says the holdout served (``why`` = "holdout") against 0.1, and,
per arm, for each of ``--holdout-seeds`` experiment seeds (the hashed draws), the
Horvitz-Thompson check of the logged ``prob``: (1/T) Σ_t [a_t = a]/prob_t has
expectation 1 for every arm when each prob is the arm's true probability.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bytewax.testing import run_main

from flows.service.dataflow import build_flow
from flows.service.instances.registry import Registry
from flows.tools.demo import Loop, loop_wiring
from flows.tools.traffic import START_TS, Demo

ARMS = ("c2", "c3", "c4", "c5", "c6")
RATES = np.array([0.02, 0.03, 0.04, 0.05, 0.06])
DELAY_S = 60.0  # mean delay of a conversion's feedback
TTL_S = 600.0
TENTHS = 10

CONFIGURATIONS = {
    "(a) no default_loss": "",
    "(b) default_loss = 1": "default_loss = 1.0\n",
}
HOLDOUT = 'default_loss = 1.0\nmin_share = 0.02\nholdout = { arm = "c2", share = 0.1 }\n'


def registry(settings: str, seed: int) -> Registry:
    arms = ", ".join(f'"{a}"' for a in ARMS)
    return Registry.from_toml(
        f"[experiments.shop]\narms = [{arms}]\nfeedback_ttl = {TTL_S}\nseed = {seed}\n{settings}"
    )


class Conversions(Demo):
    """Requests every second; feedback ``{"loss": 0}`` for a conversion only."""

    def respond(self, selection: dict) -> list[bytes]:
        _, ts, _ = self.truth[selection["request_id"]]
        if self._rng.random() >= RATES[selection["arm"]]:
            return []
        message = {
            "type": "feedback",
            "experiment": "shop",
            "request_id": selection["request_id"],
            "loss": 0.0,
            "ts": ts + float(self._rng.exponential(DELAY_S)),
        }
        return [orjson.dumps(message)]


def stream(n: int, seed: int) -> Conversions:
    demo = Conversions(events=[], span=float(n), seed=seed)
    for i in range(n):
        rid, ts = f"r{i:07d}", START_TS + float(i)
        message = {"type": "request", "experiment": "shop", "request_id": rid, "ts": ts}
        demo.events.append(orjson.dumps(message))
        demo.truth[rid] = ("shop", ts, RATES)
    return demo


def serve(n: int, seed: int, settings: str) -> list[dict]:
    """The selections of one closed-loop run, in the order served."""
    reg = registry(settings, seed)
    loop = Loop(stream(n, seed), None, {"shop": TTL_S})
    flow = build_flow(
        reg, loop_wiring(loop), clock=lambda: loop.now, flow_id="conversions", event_time=True
    )
    run_main(flow)
    order = {f"r{i:07d}": i for i in range(n)}
    return sorted(loop.selections, key=lambda s: order[s["request_id"]])


def conversions(n: int, seeds: int) -> dict:
    """Per configuration: the best arm's share per tenth, the served rate, the regret."""
    out = {}
    for label, settings in CONFIGURATIONS.items():
        shares, rates, regrets, seconds = [], [], [], []
        for seed in range(seeds):
            start = time.perf_counter()
            arms = np.array([s["arm"] for s in serve(n, seed, settings)])
            seconds.append(time.perf_counter() - start)
            assert len(arms) == n, (label, seed, len(arms))
            tenths = np.array_split(arms, TENTHS)
            shares.append([float((part == len(ARMS) - 1).mean()) for part in tenths])
            rates.append(float(RATES[arms].mean()))
            regrets.append(float((RATES.max() - RATES[arms]).sum()))
            print(f"{label} seed {seed}: rate {rates[-1]:.4f} ({seconds[-1]:.0f} s)", flush=True)
        out[label] = {
            "best_share_by_tenth": np.mean(shares, axis=0).tolist(),
            "best_share_by_tenth_sd": np.std(shares, axis=0, ddof=1).tolist(),
            "served_rate": _mean_sd(rates),
            "regret": _mean_sd(regrets),
            "seconds_per_run": float(np.mean(seconds)),
        }
    out["uniform"] = {
        "best_share_by_tenth": [1 / len(ARMS)] * TENTHS,
        "served_rate": {"mean": float(RATES.mean()), "sd": 0.0},
        "regret": {"mean": float(n * (RATES.max() - RATES.mean())), "sd": 0.0},
    }
    return out


def holdout(n: int, seed: int) -> dict:
    """The holdout's observed share and the Horvitz-Thompson check of the logged prob,
    over ``n`` requests with the experiment's ``seed`` (its hashed draws)."""
    selections = serve(n, seed, HOLDOUT)
    why = np.array([s["why"] for s in selections])
    arms = np.array([s["arm"] for s in selections])
    probs = np.array([s["prob"] for s in selections])
    share = float((why == "holdout").mean())
    ht = {}
    for a, name in enumerate(ARMS):
        terms = np.where(arms == a, 1.0 / probs, 0.0)
        ht[name] = {"mean": float(terms.mean()), "se": float(terms.std(ddof=1) / math.sqrt(n))}
    share_se = math.sqrt(0.1 * 0.9 / n)
    print(f"holdout seed {seed}: share {share:.5f} (z {(share - 0.1) / share_se:+.2f})", flush=True)
    return {
        "seed": seed,
        "requests": n,
        "holdout_share": share,
        "expected_share": 0.1,
        "share_se": share_se,
        "why": {w: int((why == w).sum()) for w in sorted(set(why.tolist()))},
        "horvitz_thompson": ht,
        "holdout_arm_min_prob": float(probs[why == "holdout"].min()),
    }


def _mean_sd(values: list[float]) -> dict[str, float]:
    return {"mean": float(np.mean(values)), "sd": float(np.std(values, ddof=1))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--holdout", type=int, default=100_000)
    parser.add_argument("--holdout-seeds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench/conversions_results.json"))
    args = parser.parse_args()
    result = {
        "machine": platform.platform(),
        "load_average": os.getloadavg(),
        "seeds": args.seeds,
        "requests": args.requests,
        "conversions": conversions(args.requests, args.seeds),
        "holdout": [holdout(args.holdout, seed) for seed in range(args.holdout_seeds)],
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
