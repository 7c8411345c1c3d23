"""The ranking's shortcuts never change an answer, checked at the size where they are taken.

- Pruning (policies/book.py, PrunedView) through the quote's own choice (``prune=None``, as the API quotes)
  on a seeded random book above ``PRUNE_MIN_ROWS``: the same options in the same order, counts and sources as
  the plain pass, for top 1, 10 and 25, including a top N that one shape class fills alone (the view must
  keep N offers per class, not one).
- The group checks' verdict remembered per job key on a book (policies/constraints.py): a job that differs
  from the one before in any field those checks read gets its own verdict.
- The options' figures rounded in one numpy pass (policies/ranking.py, ``rounded``): the very floats
  Python's ``round`` gives, halves and their neighbours included.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.models import Colocate, Fabric, Market
from broker.specs import parse_spec
from policies.book import COLOCATIONS, FABRICS, MARKETS, PRUNE_MIN_ROWS, OfferBook
from policies.ranking import quote_parts, rounded

NOW = datetime(2026, 12, 6, 12, tzinfo=UTC)
GPUS = ["H100-SXM", "A100-SXM-80GB", "L40S", "RTX-4090", "MI300X", "T4"]


def random_book(n: int, seed: int, shapes: int = 60) -> OfferBook:
    """``n`` offers of ``shapes`` shapes (every column the ranking reads drawn per shape), prices drawn
    from a few levels with some exact ties, and one cheap H100 shape with 200 offers (it fills any top N)."""
    rng = np.random.default_rng(seed)
    kind = rng.integers(0, shapes, n)
    kind[:200] = 0

    def per_shape(values: list[Any] | np.ndarray) -> np.ndarray:
        return np.asarray(values)[rng.integers(0, len(values), shapes)][kind]

    market = per_shape([MARKETS.index(m) for m in Market])
    gpu = per_shape(GPUS)
    gpu[kind == 0] = "H100-SXM"
    market[kind == 0] = MARKETS.index(Market.on_demand)
    provider = per_shape(["aws", "vast", "slurm", "neo"])
    provider[kind == 0] = "aws"
    level = rng.choice([0.9, 1.0, 1.0, 2.5, 8.0, 31.0], n) * rng.choice([1.0, 1.0, 1.07, 1.1], n)
    price = np.where(kind == 0, 0.05 + rng.integers(0, 40, n) * 0.001, level)
    data: dict[str, Any] = {
        "id": [f"o{i}" for i in range(n)], "provider": provider.tolist(), "site": provider.tolist(),
        "gpu": gpu.tolist(),
        "sku": [f"s{k}" for k in kind.tolist()],
        "region": per_shape(["us-east-1", "us-west-2", "eu", "onprem"]).tolist(),
        "zone": rng.choice(["a", "b", "c"], n).tolist(), "host": [f"h{i % 50}" for i in range(n)],
        "gpu_count": per_shape([1, 2, 8]), "price": price, "market": market,
        "interruptible": market == MARKETS.index(Market.spot), "divisible": market == MARKETS.index(Market.owned),
        "max_nodes": per_shape([1, 4]), "coloc": per_shape([COLOCATIONS.index(c) for c in Colocate]),
        "fabric": per_shape([FABRICS.index(f) for f in (Fabric.none, Fabric.ethernet, Fabric.infiniband)]),
        "fabric_gbps": per_shape([0.0, 10.0, 400.0]), "tflops": per_shape([np.nan, 300.0, 900.0]),
        "reliability": per_shape([np.nan, 0.9, 0.99]), "queue": per_shape([0.0, 0.0, 3.0]),
        "inet_down_mbps": per_shape([np.nan, 800.0]), "stale": (kind % 7 == 3) & (rng.random(n) < 0.5),
        "observed_at": NOW.timestamp() - 3600.0,
    }
    return OfferBook.from_columns(data)


JOBS: list[dict[str, Any]] = [
    {"gpu": "any", "gpus": 1, "min_gpu_memory_gb": 24, "interruptible": True,
     "workload": {"params_b": 7, "tokens_b": 1}},
    {"gpu": "any", "gpus": 1, "workload": {"hours": 5}},
    {"gpu": ["H100", "A100"], "gpus": 2, "workload": {"reference_gpu_hours": 40}, "deadline_in": "3d"},
    {"gpu": "any", "gpus": 8, "gpus_per_node": 2, "fabric": "any", "colocate": "any",
     "workload": {"params_b": 1, "tokens_b": 2}, "data": {"location": "aws:us-east-1", "size_gb": 500}},
    {"gpu": "any", "gpus": 1, "interruptible": True, "markets": ["spot", "owned"], "workload": {"hours": 2},
     "min_reliability": 0.95},
]


@pytest.fixture(scope="module")
def big() -> OfferBook:
    book = random_book(PRUNE_MIN_ROWS + 10_000, seed=25)
    assert len(book.pruned().reps) <= 0.5 * len(book)  # folds well: the quote takes the pruned path
    return book


@pytest.mark.parametrize("job", JOBS, ids=lambda j: str(j["gpu"]) + "-" + str(j["gpus"]))
@pytest.mark.parametrize("top", [1, 10, 25])
def test_the_quotes_own_choice_on_a_large_book_is_the_plain_answer(big: OfferBook, job: dict[str, Any],
                                                                      top: int) -> None:
    spec = parse_spec({"name": "scale", **job})
    chosen = quote_parts(big, spec, now=NOW, top=top, max_rejected=0)
    plain = quote_parts(big, spec, now=NOW, top=top, max_rejected=0, prune=False)
    assert chosen.json() == plain.json()
    assert chosen.options  # every job here has options: the comparison is not of two empty answers


def test_a_top_n_that_one_shape_class_fills_alone(big: OfferBook) -> None:
    """The cheap H100 class holds 200 offers: the first 25 options all come from it, so the view must
    hand out 25 members of one class (not its cheapest alone), in the plain pass's order."""
    spec = parse_spec({"name": "one-class", "gpu": "H100", "gpus": 1, "markets": ["on_demand"],
                       "workload": {"hours": 10}})
    chosen = quote_parts(big, spec, now=NOW, top=25, max_rejected=0, prune=True)
    plain = quote_parts(big, spec, now=NOW, top=25, max_rejected=0, prune=False)
    assert chosen.json() == plain.json()
    assert len(chosen.options) == 25
    assert {o["sku"] for o in chosen.options} == {"s0"}
    costs = [o["expected_cost_usd"] for o in chosen.options]
    assert costs == sorted(costs) and len(set(costs)) > 1


# What the group checks read of a job (policies/constraints.py, _group_checks), each changed alone.
GROUP_FIELDS: list[dict[str, Any]] = [
    {"providers": ["vast"]}, {"onprem_only": True}, {"cloud_ok": False}, {"markets": ["spot"]},
    {"regions": ["eu"]}, {"gpu": ["L40S", "T4"]}, {"runtime": "rocm"},
]


@pytest.mark.parametrize("change", GROUP_FIELDS, ids=lambda c: next(iter(c)))
def test_a_job_differing_in_one_group_field_gets_its_own_verdict(change: dict[str, Any]) -> None:
    base = {"name": "memo", "gpu": "any", "gpus": 1, "interruptible": True, "workload": {"hours": 3}}
    shared = random_book(3_000, seed=7)
    before = quote_parts(shared, parse_spec(base), now=NOW, max_rejected=3)
    after = quote_parts(shared, parse_spec({**base, **change}), now=NOW, max_rejected=3)
    fresh = quote_parts(random_book(3_000, seed=7), parse_spec({**base, **change}), now=NOW, max_rejected=3)
    assert after.json() == fresh.json()
    assert after.rejected_counts != before.rejected_counts  # the change matters on this book
    again = quote_parts(shared, parse_spec({**base, "name": "other"}), now=NOW, max_rejected=3)
    assert again.options == before.options and again.rejected_counts == before.rejected_counts


DIGITS = [1, 2, 4]


def halves() -> st.SearchStrategy[float]:
    """Values at a half of the last decimal kept, and one ulp either side: where rounding is hardest."""
    return st.builds(lambda k, d, ulps: float(np.nextafter((k + 0.5) / 10.0 ** d, math.inf if ulps > 0 else -math.inf))
                     if ulps else (k + 0.5) / 10.0 ** d, st.integers(-10**9, 10**9), st.sampled_from(DIGITS),
                     st.sampled_from([-1, 0, 1]))


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), halves(),
                                 st.floats(-1e6, 1e6)), min_size=1, max_size=12),
       digits=st.lists(st.sampled_from(DIGITS), min_size=1, max_size=4))
def test_rounded_gives_pythons_round(values: list[float], digits: list[int]) -> None:
    grid = np.array([values] * len(digits))
    got = rounded(grid, np.array(digits))
    for row, d in zip(got, digits, strict=True):
        want = [round(v, d) for v in values]
        assert [repr(x) for x in row] == [repr(x) for x in want]  # repr: NaN equal to NaN, -0.0 apart from 0.0
