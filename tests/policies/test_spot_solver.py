"""The spot plan's solver and market model against their plain statements (the recurrence as first written).

``policies.spot._solve`` keeps its buffers between steps and ``availability_model`` counts runs
with numpy, for speed; both must give exactly what the plain code gives, table for table and
hazard for hazard (the simulator's reported results depend on every choice).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import numpy as np

from policies.spot import (
    DEFAULT_BUCKETS,
    DEFAULT_STEP_HOURS,
    PRIOR_DOWN_HOURS,
    PRIOR_RUNS,
    PRIOR_UP_HOURS,
    SPOT,
    UNREACHABLE,
    AvailabilityModel,
    _solve,
    availability_model,
    plan_step,
    resample,
)

IDLE, ON_DEMAND = 0, 2


def reference_solve(model: AvailabilityModel, changeover_steps: int, price_ratio: float, steps: int,
           slack: int) -> np.ndarray:
    """Best action per state: ``table[n, where, x, s]`` for ``n`` steps left, ``s`` steps of slack.

    ``where``: 0 waiting (idle), 1 running on-demand. ``x < B``: spot up for ``x`` steps;
    ``x ≥ B``: down for ``x − B`` steps. Prices per step: spot ``price_ratio``, on-demand 1.
    """
    B = model.buckets
    X = 2 * B
    k = changeover_steps
    p, q = price_ratio, 1.0
    up = np.arange(X) < B
    flip = np.array(model.up_hazard + model.down_hazard)
    older = np.array([min(b + 1, B - 1) for b in range(B)] + [B + min(b + 1, B - 1) for b in range(B)])
    T = np.zeros((X, X))  # one step of the market
    T[np.arange(X), older] += 1 - flip
    T[np.arange(X), np.r_[np.full(B, B), np.zeros(B, dtype=int)]] += flip
    Tk = np.linalg.matrix_power(T, k) if k else np.eye(X)
    # a spot start from x: lost at step j (paid j steps, then waiting, just down) or alive after k steps
    lost = np.zeros((k, X))
    alive = np.eye(X) * up[:, None]
    stay = T * up[None, :]  # moves that keep spot up
    for j in range(k):
        lost[j] = alive.sum(axis=1) - (alive @ stay).sum(axis=1)
        alive = alive @ stay
    S1 = slack + 1
    inf = UNREACHABLE
    table = np.zeros((steps + 1, 2, X, S1), dtype=np.int8)
    s_idx = np.arange(S1)
    hist: list[np.ndarray] = [np.zeros((3, X, S1))]  # V[n] for the last k+1 n

    def shifted(a: np.ndarray, by: int) -> np.ndarray:
        """a[..., s - by]: a move that spends ``by`` steps of slack (inf where there is not enough)."""
        if by == 0:
            return a
        out = np.full(a.shape, inf)
        if by < S1:
            out[..., by:] = a[..., :S1 - by]
        return out

    def back(j: int) -> np.ndarray:
        return hist[max(0, len(hist) - j)]

    for n in range(1, steps + 1):
        prev = back(1)
        spot_next = np.where(up[:, None], prev[SPOT], prev[IDLE])  # a lost spot instance leaves the job waiting
        wait = shifted(T @ prev[IDLE], 1)
        run_spot = p + T @ spot_next
        run_od = q + T @ prev[ON_DEMAND]
        if k:
            start_od = k * q + shifted(Tk @ back(k)[ON_DEMAND], k)
            start_spot = alive.sum(axis=1)[:, None] * (k * p) + alive @ shifted(back(k)[SPOT], k)
            for j in range(k):
                start_spot = start_spot + lost[j][:, None] * ((j + 1) * p + shifted(back(j + 1)[IDLE][B], j + 1))
        else:
            start_od, start_spot = run_od, run_spot
        start_spot = np.where(up[:, None], start_spot, inf)
        V = np.empty((3, X, S1))
        idle_choices = np.stack([wait, start_spot, start_od])
        table[n, 0] = idle_choices.argmin(axis=0)
        V[IDLE] = idle_choices.min(axis=0)
        V[SPOT] = np.where(up[:, None], run_spot, V[IDLE])
        od_choices = np.stack([run_od, start_spot])
        pick = od_choices.argmin(axis=0)
        table[n, 1] = np.where(pick == 1, SPOT, ON_DEMAND)
        V[ON_DEMAND] = od_choices.min(axis=0)
        np.minimum(V, UNREACHABLE, out=V)
        V[:, :, s_idx >= n] = 0.0  # no work left: done
        hist.append(V)
        if len(hist) > k + 1:
            hist.pop(0)
    table.setflags(write=False)
    return table


def reference_model(series: Sequence[bool] | np.ndarray, gap_seconds: float, *,
                       step_hours: float = DEFAULT_STEP_HOURS, buckets: int = DEFAULT_BUCKETS) -> AvailabilityModel:
    """Hazards from an availability history (one bool per tick of ``gap_seconds``; True = spot could be had).

    Every completed run of availability (and of unavailability) counts once at each age it
    lived through and once where it ended; the run still going at the end of the history counts
    only where it lived (it has not ended). A prior of ``PRIOR_RUNS`` geometric runs per side keeps
    a short history from swinging the model.
    """
    ticks = plan_step(gap_seconds, step_hours)
    step = ticks * gap_seconds / 3600.0
    steps = resample(series, ticks)
    runs = [(bool(k), sum(1 for _ in g)) for k, g in itertools.groupby(steps)]
    hazards = []
    for side, prior_hours in ((True, PRIOR_UP_HOURS), (False, PRIOR_DOWN_HOURS)):
        ended = np.zeros(buckets)
        at_risk = np.zeros(buckets)
        for i, (up, length) in enumerate(runs):
            if up is not side:
                continue
            full = min(length, buckets - 1)
            at_risk[:full] += 1
            if length >= buckets:
                at_risk[buckets - 1] += length - (buckets - 1)
            if i < len(runs) - 1:  # the last run has not ended
                ended[min(length - 1, buckets - 1)] += 1
        h0 = min(1.0, step / prior_hours)
        prior_risk = PRIOR_RUNS * (1 - h0) ** np.arange(buckets)
        prior_risk[-1] /= max(h0, 1e-9)
        hz = (ended + prior_risk * h0) / (at_risk + prior_risk)
        hazards.append(tuple(float(x) for x in np.clip(hz, 1e-6, 1 - 1e-6)))
    return AvailabilityModel(step, hazards[0], hazards[1], runs_seen=len(runs))


def test_solver_tables_equal_the_plain_recurrence() -> None:
    rng = random.Random(16)
    for case in range(60):
        buckets = rng.choice([1, 2, 3, 8])
        model = AvailabilityModel(0.1, tuple(rng.uniform(1e-6, 1 - 1e-6) for _ in range(buckets)),
                                  tuple(rng.uniform(1e-6, 1 - 1e-6) for _ in range(buckets)))
        k = rng.choice([0, 1, 2, 3, 5])
        ratio = rng.choice([0.3, 0.5, 0.9, 1.0])
        steps, slack = rng.randint(1, 120), rng.choice([0, 1, 2, rng.randint(0, 60)])
        got, want = _solve(model, k, ratio, steps, slack), reference_solve(model, k, ratio, steps, slack)
        assert got.shape == want.shape and np.array_equal(got, want), (case, model, k, ratio, steps, slack)
        assert set(np.unique(got[1:])) <= {IDLE, SPOT, ON_DEMAND}


def test_market_model_equals_the_plain_count() -> None:
    rng = random.Random(7)
    for case in range(300):
        n = rng.choice([0, 1, 2, 5, 50, 600])
        up = rng.random()
        series = np.repeat(np.array([rng.random() < up for _ in range(n)], dtype=bool), rng.choice([1, 3, 12]))
        gap = rng.choice([30, 60, 600])
        step, buckets = rng.choice([0.1, 0.2, 0.5]), rng.choice([1, 2, 8])
        got = availability_model(series, gap, step_hours=step, buckets=buckets)
        want = reference_model(series, gap, step_hours=step, buckets=buckets)
        assert repr(got) == repr(want), (case, n, gap, step, buckets)  # repr: NaN-free, to the last digit
        assert got.summary() == want.summary()
