"""Baselines for the arena: the BatchBandit-style contract and each algorithm's behaviour."""

import math

import numpy as np
import pytest

from arena.lab.baselines import AHB, EpsilonGreedy, Exp3, Exp3IX, Exp3S, TsallisInf
from tsi_core import TicketBatch, TicketError

M, N = 4, 6

FACTORIES = {
    "exp3-oracle": lambda seed=None: Exp3.oracle(N, M, 500, loss_range=(-2.0, 3.0), seed=seed),
    "exp3-raw": lambda seed=None: Exp3.raw(N, M, 500, seed=seed),
    "exp3-running": lambda seed=None: Exp3.running(N, M, 500, seed=seed),
    "exp3-gamma": lambda seed=None: Exp3(N, M, seed, eta=0.3, gamma=0.1),
    "exp3-ix": lambda seed=None: Exp3IX(N, M, seed, horizon=500),
    "exp3-ix-oracle": lambda seed=None: Exp3IX(N, M, seed, horizon=500, loss_range=(-2.0, 3.0)),
    "exp3s": lambda seed=None: Exp3S(N, M, seed, horizon=500, switches=2),
    "tsallis": lambda seed=None: TsallisInf(N, M, seed),
    "ahb": lambda seed=None: AHB(N, M, seed),
    "eps-greedy": lambda seed=None: EpsilonGreedy(N, M, seed),
}
ALL = pytest.mark.parametrize("make", FACTORIES.values(), ids=FACTORIES.keys())


def losses_for(arms, t):
    """A deterministic loss table: arm 1 best, a little drift, values in [-2, 3]."""
    return np.where(arms == 1, -1.0, 2.0) + 0.5 * np.sin(0.1 * t + arms)


def play(alg, rounds, loss=losses_for, u=None):
    arms = []
    for t in range(rounds):
        tickets = alg.select(u=None if u is None else u[t])
        alg.update(tickets, loss(tickets.arms, t))
        arms.append(tickets.arms)
    return np.array(arms)


def snapshot(alg):
    state = {}
    for key, value in vars(alg).items():
        if isinstance(value, np.ndarray):
            state[key] = value.copy()
        elif key == "_open":
            state[key] = sorted(value)
        elif key == "_rng":
            state[key] = repr(value.bit_generator.state)
        elif isinstance(value, (int, float, str, tuple, type(None))):
            state[key] = value
    return state


def assert_same_state(before, after):
    assert before.keys() == after.keys()
    for key, value in before.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, after[key], err_msg=key)
        else:
            assert value == after[key], key


def pseudo_regret(alg, means, rounds, rng, scale=1.0, shift=0.0):
    """Σ_t <q_t, μ_t> - min_i Σ_t μ_{t,i} per instance, on Bernoulli losses (scaled)."""
    n = alg.n_instances
    expected = np.zeros(n)
    best = np.zeros(means(0).shape)
    for t in range(rounds):
        mu = means(t)
        expected += alg.probabilities() @ mu
        best += mu
        tickets = alg.select()
        drawn = (rng.random(n) < mu[tickets.arms]).astype(float)
        alg.update(tickets, scale * drawn + shift)
    return expected - best.min()


# ------------------------------------------------------------------------- contract
@ALL
def test_shapes_names_and_probabilities(make):
    alg = make(seed=1)
    assert isinstance(type(alg).name, str) and isinstance(alg.name, str) and alg.name
    for t in range(60):
        q = alg.probabilities()
        assert q.shape == (N, M)
        np.testing.assert_allclose(q.sum(axis=1), 1.0, rtol=1e-12)
        assert (q >= 0).all() and np.isfinite(q).all()
        tickets = alg.select()
        assert isinstance(tickets, TicketBatch) and tickets.every and len(tickets) == N
        assert tickets.arms.shape == (N,) and ((tickets.arms >= 0) & (tickets.arms < M)).all()
        assert tickets.instances.tolist() == list(range(N))
        assert (tickets.rounds == t + 1).all()
        np.testing.assert_array_equal(tickets.probs, q[np.arange(N), tickets.arms])
        assert (tickets.probs > 0).all()
        alg.update(tickets, losses_for(tickets.arms, t))
    assert (alg.n_updates == 60).all() and (alg.n_rounds == 60).all()


@ALL
def test_same_seed_same_arms_and_given_u_is_deterministic(make):
    a, b = play(make(seed=5), 80), play(make(seed=5), 80)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, play(make(seed=6), 80))  # the seed does matter
    u = np.random.default_rng(0).random((80, N))
    np.testing.assert_array_equal(play(make(seed=1), 80, u=u), play(make(seed=2), 80, u=u))


@ALL
def test_refused_updates_change_nothing(make):
    alg, other = make(seed=1), make(seed=1)
    play(alg, 10)
    tickets = alg.select()
    foreign = other.select()
    good = losses_for(tickets.arms, 10)
    before = snapshot(alg)
    refusals = [
        (TicketError, foreign, good),
        (TicketError, "not a ticket batch", good),
        (ValueError, tickets, np.where(np.arange(N) == 2, np.nan, good)),
        (ValueError, tickets, np.where(np.arange(N) == 0, -np.inf, good)),
        (ValueError, tickets, good[:-1]),
        (ValueError, tickets, np.ones(N, dtype=bool)),
        (ValueError, tickets, ["a"] * N),
    ]
    for error, batch, losses in refusals:
        with pytest.raises(error):
            alg.update(batch, losses)
        assert_same_state(before, snapshot(alg))
    alg.update(tickets, good)  # still open after the refusals
    settled = snapshot(alg)
    with pytest.raises(TicketError, match="already settled"):
        alg.update(tickets, good)
    assert_same_state(settled, snapshot(alg))
    dropped = alg.select()
    alg.discard(dropped)
    with pytest.raises(TicketError, match="already settled"):
        alg.update(dropped, good)


@ALL
def test_refused_selections_change_nothing(make):
    alg = make(seed=1)
    play(alg, 5)
    before = snapshot(alg)
    for kwargs in (
        {"contexts": np.zeros(N, dtype=int)},
        {"instances": [0, 1]},
        {"u": np.full(N, 1.0)},
        {"u": np.full(N, -0.1)},
        {"u": np.full(N + 1, 0.5)},
        {"u": np.full(N, np.nan)},
    ):
        with pytest.raises(ValueError):
            alg.select(**kwargs)
        assert_same_state(before, snapshot(alg))


@ALL
def test_extreme_losses_never_give_nan(make):
    alg = make(seed=3)
    rng = np.random.default_rng(3)
    magnitudes = np.array([1e300, -1e300, 1e-300, -1e6, 1e6, 0.0, 7.0, -1.5e308, 1.7e308])
    for _ in range(300):
        tickets = alg.select()
        alg.update(tickets, rng.choice(magnitudes, size=N))
        q = alg.probabilities()
        assert np.isfinite(q).all()
        np.testing.assert_allclose(q.sum(axis=1), 1.0, rtol=1e-12)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Exp3(0, 3, horizon=10), "n_instances"),
        (lambda: Exp3(2, 0, horizon=10), "n_arms"),
        (lambda: Exp3(2, 3, -1, horizon=10), "seed"),
        (lambda: Exp3(2, True, horizon=10), "n_arms"),
        (lambda: Exp3(2, 3), "horizon"),
        (lambda: Exp3(2, 3, horizon=0), "horizon"),
        (lambda: Exp3(2, 3, eta=-0.1), "eta"),
        (lambda: Exp3(2, 3, eta=math.inf), "eta"),
        (lambda: Exp3(2, 3, eta=0.1, gamma=1.5), "gamma"),
        (lambda: Exp3(2, 3, horizon=9, normalise="max"), "normalise"),
        (lambda: Exp3(2, 3, horizon=9, normalise="running", loss_range=(0, 1)), "not both"),
        (lambda: Exp3.oracle(2, 3, 10, loss_range=(1.0, 0.0)), "lo < hi"),
        (lambda: Exp3.oracle(2, 3, 10, loss_range=(0.0, math.nan)), "loss_range"),
        (lambda: Exp3.oracle(2, 3, 10, loss_range=(-1e308, 1e308)), "loss_range"),
        (lambda: Exp3.oracle(2, 3, 10, loss_range=5.0), "pair"),
        (lambda: Exp3.oracle(2, 3, 10, loss_range=None), "loss_range"),
        (lambda: Exp3IX(2, 3), "horizon"),
        (lambda: Exp3IX(2, 3, horizon=10, gamma_ix=-1.0), "gamma_ix"),
        (lambda: Exp3S(2, 3, horizon=10, switches=-1), "switches"),
        (lambda: Exp3S(2, 3, horizon=10, switches=1, alpha=0.0), "alpha"),
        (lambda: Exp3S(2, 3, horizon=10, switches=1, gamma=0.0), "gamma"),
        (lambda: TsallisInf(2, 3, loss_range=(2.0, 2.0)), "lo < hi"),
        (lambda: AHB(2, 3, explore=-1.0), "explore"),
        (lambda: AHB(2, 3, explore=math.inf), "explore"),
        (lambda: EpsilonGreedy(2, 3, c=0.0), "c"),
        (lambda: EpsilonGreedy(2, 3, c=-1.0), "c"),
        (lambda: EpsilonGreedy(2, 3, c=math.inf), "c"),
    ],
)
def test_constructors_name_the_bad_value(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_single_arm_is_always_arm_zero():
    for make in (
        lambda: Exp3.raw(3, 1, 50),
        lambda: Exp3IX(3, 1, horizon=50),
        lambda: Exp3S(3, 1, horizon=50, switches=1),
        lambda: TsallisInf(3, 1),
        lambda: AHB(3, 1),
        lambda: EpsilonGreedy(3, 1),
    ):
        alg = make()
        assert (play(alg, 20) == 0).all()
        np.testing.assert_array_equal(alg.probabilities(), np.ones((3, 1)))


# ------------------------------------------------------------------------------ EXP3
def test_exp3_variants_have_distinct_names():
    names = {
        Exp3.oracle(1, 2, 10, loss_range=(0, 1)).name,
        Exp3.raw(1, 2, 10).name,
        Exp3.running(1, 2, 10).name,
    }
    assert names == {"EXP3 (oracle)", "EXP3 (raw)", "EXP3 (running min/max)"}
    assert Exp3IX(1, 2, horizon=5).name != Exp3IX(1, 2, horizon=5, loss_range=(0, 1)).name


def test_exp3_tuning_is_the_stated_rate():
    assert Exp3.raw(1, 5, 3000).eta == pytest.approx(math.sqrt(2 * math.log(5) / (5 * 3000)))
    ix = Exp3IX(1, 5, horizon=3000)
    assert ix.gamma_ix == pytest.approx(ix.eta / 2) and ix.eta == Exp3.raw(1, 5, 3000).eta


def test_exp3_with_tiny_eta_stays_uniform():
    alg = Exp3(N, M, 0, eta=1e-12)
    play(alg, 500)
    np.testing.assert_allclose(alg.probabilities(), 1.0 / M, atol=1e-9)
    moved = Exp3(N, M, 0, eta=0.1)  # the same table does move a real learning rate
    play(moved, 500)
    assert (moved.probabilities()[:, 1] > 0.9).all()


def test_exp3_gamma_mixes_in_uniform_exploration():
    alg = Exp3(N, M, 0, eta=5.0, gamma=0.2)
    play(alg, 300)
    q = alg.probabilities()
    assert q.min() >= 0.2 / M - 1e-15
    assert q[:, 1].min() > 0.8


def test_oracle_exp3_regret_is_below_its_bound_on_a_stochastic_table():
    t, m, n = 3000, 5, 20
    mu = np.array([0.3, 0.5, 0.5, 0.5, 0.5])
    alg = Exp3.oracle(n, m, t, loss_range=(10.0, 20.0), seed=0)  # losses 10 + 10·Bernoulli
    regret = pseudo_regret(alg, lambda _: mu, t, np.random.default_rng(1), scale=10.0, shift=10.0)
    uniform = t * (mu.mean() - mu.min())
    assert regret.mean() < math.sqrt(2 * t * m * math.log(m))  # Bubeck & Cesa-Bianchi Thm 3.1
    assert regret.mean() < 0.5 * uniform


def test_exp3_raw_survives_huge_losses_and_degenerates_without_nan():
    alg = Exp3.raw(8, 5, 2000, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(2000):
        tickets = alg.select()
        alg.update(tickets, 1e6 + 1000 * rng.random(8))
        assert np.isfinite(alg.probabilities()).all()
    q = alg.probabilities()
    np.testing.assert_allclose(q.sum(axis=1), 1.0, rtol=1e-12)
    assert (q.max(axis=1) > 0.999).all()  # all mass on one arm: expected, not a bug


def test_exp3_running_is_invariant_to_affine_maps_and_raw_is_not():
    u = np.random.default_rng(9).random((400, N))

    def affine(a, b):
        return lambda arms, t: a * losses_for(arms, t) + b

    base = Exp3.running(N, M, 400)
    arms = play(base, 400, u=u)
    moved = Exp3.running(N, M, 400)
    np.testing.assert_array_equal(play(moved, 400, loss=affine(3e4, -7e5), u=u), arms)
    np.testing.assert_allclose(moved.probabilities(), base.probabilities(), rtol=1e-9)
    raw, raw_scaled = Exp3.raw(N, M, 400), Exp3.raw(N, M, 400)
    play(raw, 400, u=u)
    play(raw_scaled, 400, loss=affine(1e-3, 0.0), u=u)
    assert np.abs(raw.probabilities() - raw_scaled.probabilities()).max() > 0.1


# --------------------------------------------------------------------------- EXP3-IX
def test_exp3_ix_matches_a_direct_single_instance_transcription():
    m, t = 5, 400
    rng = np.random.default_rng(4)
    table = rng.random((t, m))
    u = rng.random(t)
    alg = Exp3IX(1, m, horizon=t)
    eta = math.sqrt(2 * math.log(m) / (m * t))
    gamma = eta / 2
    cum = [0.0] * m
    for s in range(t):
        low = min(cum)
        w = [math.exp(-eta * (c - low)) for c in cum]
        p = [x / sum(w) for x in w]
        np.testing.assert_allclose(alg.probabilities()[0], p, rtol=1e-12)
        arm, acc = m - 1, 0.0
        for i, pi in enumerate(p):
            acc += pi
            if u[s] < acc:
                arm = i
                break
        tickets = alg.select(u=[u[s]])
        assert tickets.arms[0] == arm
        loss = table[s, arm]
        alg.update(tickets, [loss])
        cum[arm] += loss / (p[arm] + gamma)


# ----------------------------------------------------------------------------- EXP3.S
def test_exp3s_tuning_follows_corollary_8():
    m, t, s = 4, 5000, 3
    alg = Exp3S(1, m, horizon=t, switches=s)
    assert alg.alpha == 1 / t
    expected = min(1.0, math.sqrt(m * (s * math.log(m * t) + math.e) / ((math.e - 1) * t)))
    assert alg.gamma == pytest.approx(expected)


def test_exp3s_log_domain_matches_the_weight_update():
    m, t = 4, 300
    rng = np.random.default_rng(5)
    table, u = rng.random((t, m)), rng.random(t)
    alg = Exp3S(1, m, horizon=t, switches=2)
    alpha, gamma = alg.alpha, alg.gamma
    w = np.ones(m)
    for s in range(t):
        p = (1 - gamma) * w / w.sum() + gamma / m
        np.testing.assert_allclose(alg.probabilities()[0], p, rtol=1e-9)
        tickets = alg.select(u=[u[s]])
        arm = tickets.arms[0]
        alg.update(tickets, [table[s, arm]])
        gain = np.zeros(m)
        gain[arm] = (1 - table[s, arm]) / p[arm]
        w = w * np.exp(gamma * gain / m) + math.e * alpha / m * w.sum()
        w /= w.max()  # the update is homogeneous: rescaling keeps p


def test_exp3s_tracks_a_switch_faster_than_exp3():
    m, t, n = 3, 4000, 10
    early, late = np.array([0.2, 0.8, 0.8]), np.array([0.8, 0.2, 0.8])

    def new_best_share(alg):
        """Probability of the new best arm (1) in each round after the switch at t/2."""
        rng = np.random.default_rng(7)
        share = []
        for s in range(t):
            mu = early if s < t // 2 else late
            if s >= t // 2:
                share.append(alg.probabilities()[:, 1])
            tickets = alg.select()
            alg.update(tickets, (rng.random(n) < mu[tickets.arms]).astype(float))
        share = np.array(share)
        recovered = share > 0.5
        return share.mean(), np.where(recovered.any(axis=0), recovered.argmax(axis=0), t // 2)

    switching, switching_delay = new_best_share(Exp3S(n, m, 0, horizon=t, switches=1))
    fixed, fixed_delay = new_best_share(Exp3.oracle(n, m, t, loss_range=(0, 1), seed=0))
    assert switching > 0.7 and switching > fixed + 0.2
    assert np.median(switching_delay) < 0.6 * np.median(fixed_delay)
    assert switching_delay.max() < 500


# ------------------------------------------------------------------------ Tsallis-INF
def test_tsallis_inf_solves_its_normalisation_and_minimises_its_objective():
    alg = TsallisInf(N, M, seed=2)
    rng = np.random.default_rng(2)
    for _ in range(150):
        tickets = alg.select()
        alg.update(tickets, rng.random(N) + 0.3 * tickets.arms)
    q = alg.probabilities()
    np.testing.assert_allclose(q.sum(axis=1), 1.0, rtol=1e-14)
    eta, cum = alg.eta, alg.cum_losses.T  # (N,), (N, M)
    assert eta == pytest.approx(2 / math.sqrt(151))
    z = cum - 2.0 / (eta[:, None] * np.sqrt(q))  # q_i = 4 / (η (L̂_i - z))² for one z
    np.testing.assert_allclose(z, z[:, :1] * np.ones(M), rtol=0, atol=1e-9 * np.abs(z).max())
    assert (z[:, 0] < cum.min(axis=1)).all()

    def objective(p):
        return (p * cum).sum(axis=-1) - (4 / eta) * np.sqrt(p).sum(axis=-1)

    others = rng.dirichlet(np.ones(M), size=(2000, N))
    nearby = np.clip(q + rng.normal(scale=1e-3, size=(2000, N, M)), 0, None)
    nearby /= nearby.sum(axis=-1, keepdims=True)
    best = objective(q)
    assert (objective(others) >= best - 1e-12).all()
    assert (objective(nearby) >= best - 1e-12).all()


def test_tsallis_inf_has_low_regret_on_a_stochastic_table():
    t, m, n = 3000, 5, 10
    mu = np.array([0.3, 0.5, 0.5, 0.5, 0.5])
    regret = pseudo_regret(TsallisInf(n, m, seed=0), lambda _: mu, t, np.random.default_rng(1))
    assert regret.mean() < 4 * math.sqrt(m * t) + 1  # Zimmert & Seldin, Theorem 1
    assert regret.mean() < 0.3 * t * (mu.mean() - mu.min())


# ------------------------------------------------------------------------------- AHB
def test_ahb_starts_with_one_round_of_each_arm():
    alg = AHB(N, M, seed=0)
    for arm in range(M):
        q = alg.probabilities()
        np.testing.assert_array_equal(q, np.eye(M)[[arm] * N])
        tickets = alg.select(u=np.random.default_rng(arm).random(N))
        assert (tickets.arms == arm).all() and (tickets.probs == 1.0).all()
        alg.update(tickets, losses_for(tickets.arms, arm))
    assert (alg.probabilities() < 1.0).all()


def test_ahb_decisions_are_scale_free_exactly_for_powers_of_two():
    u = np.random.default_rng(11).random((500, N))
    base = AHB(N, M)
    arms = play(base, 500, u=u)
    for a in (2.0**-30, 2.0**40):
        scaled = AHB(N, M)
        assert np.array_equal(
            play(scaled, 500, loss=lambda x, t, a=a: a * losses_for(x, t), u=u), arms
        )
        np.testing.assert_array_equal(scaled.probabilities(), base.probabilities())
        np.testing.assert_array_equal(scaled.eta * a, base.eta)


@pytest.mark.parametrize(("scale", "shift"), [(1e-7, 0.0), (3.3e9, 0.0), (1.0, 1e3), (7.0, -5e4)])
def test_ahb_decisions_are_scale_and_translation_free_up_to_rounding(scale, shift):
    u = np.random.default_rng(12).random((500, N))
    base = AHB(N, M)
    arms = play(base, 500, u=u)
    moved = AHB(N, M)
    play_arms = play(moved, 500, loss=lambda x, t: scale * losses_for(x, t) + shift, u=u)
    np.testing.assert_array_equal(play_arms, arms)
    np.testing.assert_allclose(moved.probabilities(), base.probabilities(), rtol=1e-6)
    raw = play(Exp3.raw(N, M, 500), 500, loss=lambda x, t: scale * losses_for(x, t) + shift, u=u)
    assert not np.array_equal(raw, play(Exp3.raw(N, M, 500), 500, u=u))  # EXP3 is not


def test_ahb_learns_on_a_table_of_unknown_range():
    t, m, n = 3000, 5, 10
    mu = np.array([0.3, 0.5, 0.5, 0.5, 0.5])
    regret = pseudo_regret(AHB(n, m, seed=0), lambda _: mu, t, np.random.default_rng(1), 1e6, 1e9)
    assert regret.mean() < 0.5 * t * (mu.mean() - mu.min())
    assert regret.mean() < math.sqrt(2 * t * m * math.log(m))


# --------------------------------------------------------------------------- ε-greedy
def test_epsilon_greedy_concentrates_on_the_best_arm_of_an_easy_bernoulli_table():
    means = np.array([0.7, 0.2, 0.8, 0.6])  # arm 1 best by 0.4
    alg = EpsilonGreedy(20, 4, seed=0)
    rng = np.random.default_rng(100)  # not the policy's seed: its draws would pick the losses
    regret = pseudo_regret(alg, lambda t: means, 3000, rng)
    q = alg.probabilities()
    assert (q.argmax(axis=1) == 1).all()
    # ε_t = 5·4/3001 at the end: the greedy arm has 1 − ε + ε/4 of the mass
    np.testing.assert_allclose(q[:, 1], 1.0 - 0.75 * 20 / 3001, rtol=1e-12)
    # exploration costs about Σ_t ε_t·(mean gap) ≈ 20·(1 + ln(3000/20))·0.35 ≈ 42
    assert regret.mean() < 80.0


def test_epsilon_greedy_selections_are_identical_under_an_affine_map_of_integer_losses():
    rng = np.random.default_rng(4)
    table = rng.poisson([3.0, 2.0, 4.0, 2.5], size=(1500, M)).astype(float)
    runs = []
    for scale, shift in ((1.0, 0.0), (4.0, 3.0), (0.25, -1e6)):
        alg = EpsilonGreedy(N, M, seed=9)
        arms = play(alg, 1500, loss=lambda a, t, s=scale, b=shift: s * table[t, a] + b)
        runs.append((arms, alg.probabilities()))
    for arms, q in runs[1:]:
        np.testing.assert_array_equal(arms, runs[0][0])
        np.testing.assert_array_equal(q, runs[0][1])
    assert len(np.unique(runs[0][0][-500:])) > 1  # it still explores: not a trivial match


def test_epsilon_greedy_explores_uniformly_first_then_breaks_ties_by_index():
    alg = EpsilonGreedy(2, 3, seed=0, c=1.0)
    for _ in range(3):  # ε = min(1, 3/t) = 1: uniform
        np.testing.assert_allclose(alg.probabilities(), 1 / 3)
        alg.update(alg.select(), np.zeros(2))
    alg.sums[:] = 0.0
    alg.counts[:] = 1  # every mean 0: a tie, the greedy arm is arm 0
    assert alg.greedy().tolist() == [0, 0]
    q = alg.probabilities()  # ε_4 = 3/4
    np.testing.assert_allclose(q[:, 0], 0.25 + 0.75 / 3)
    alg.counts[2, 1] = 0  # an unplayed arm comes first
    assert alg.greedy().tolist() == [0, 2]
    # means within 1e-9 of the range seen count as tied (rounding cannot break a tie)
    alg.counts[:] = 1
    alg.low[:], alg.high[:] = -5.0, 5.0
    alg.sums[:, 0] = [1.0, 1.0 - 5e-9, 3.0]  # inside the tolerance of 1e-8
    alg.sums[:, 1] = [1.0, 1.0 - 2e-8, 3.0]  # outside
    assert alg.greedy().tolist() == [0, 1]
