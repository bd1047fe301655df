"""The capacity ladder's walk (``decide/ladder.py``): what follows each way a rung's wait ends, and which rung a pool
that exists is on."""

from __future__ import annotations

from typing import Any

import pytest

from nemo_rl_gke.decide import ladder
from nemo_rl_gke.plan import gke
from nemo_rl_gke.run import capacity
from nemo_rl_gke.run.spec import RunSpec, default_conf
from tests.owners import owner_of

RUNGS = (capacity.Rung("reservation", 60.0), capacity.Rung("flex_start", 600.0), capacity.Rung("spot", 30.0))


def _row(option: str, outcome: str) -> dict[str, Any]:
    return capacity.row(option, 1.0, started_at="t0", ended_at="t1", outcome=outcome, message=f"{option} {outcome}")


@pytest.mark.parametrize(
    ("index", "outcome", "move", "next_rung"),
    [
        (0, capacity.SERVED, ladder.Move.SERVED, None),
        (0, capacity.STOCKOUT, ladder.Move.NEXT, 1),
        (1, capacity.NO_NODES, ladder.Move.NEXT, 2),
        # The last rung has nothing after it.
        (2, capacity.STOCKOUT, ladder.Move.FAIL, None),
        (2, capacity.NO_NODES, ladder.Move.FAIL, None),
        # A failure the next rung's nodes would meet too (a pod that cannot start) ends the ladder on any rung.
        (0, capacity.FAILED, ladder.Move.FAIL, None),
        (2, capacity.SERVED, ladder.Move.SERVED, None),
    ],
)
def test_each_way_a_rung_ends_has_one_move(index: int, outcome: str, move: ladder.Move, next_rung: int | None) -> None:
    before = [_row(r.capacity, capacity.NO_NODES) for r in RUNGS[:index]]
    ended = _row(RUNGS[index].capacity, outcome)
    answer = ladder.after_rung(RUNGS, index, ended, before)
    assert (answer.move, answer.next_rung) == (move, next_rung)
    # Every rung tried is kept, this one last, in the order tried.
    assert list(answer.rows) == [*before, ended]


def test_a_lone_rung_has_no_next_and_a_failure_names_every_rung_tried() -> None:
    assert ladder.after_rung(RUNGS[:1], 0, _row("reservation", capacity.STOCKOUT), []).move is ladder.Move.FAIL
    before = [_row("reservation", capacity.STOCKOUT), _row("flex_start", capacity.NO_NODES)]
    answer = ladder.after_rung(RUNGS, 2, _row("spot", capacity.STOCKOUT), before)
    assert answer.tried() == "reservation: stock-out; flex_start: no-nodes-in-time; spot: stock-out"


def _pool(option: str) -> dict[str, Any]:
    """The pool of ``option`` as the run creates it (and GKE returns it)."""
    ladder_conf = ["reservation", "flex_start", "spot", "on_demand"]
    spec = capacity.on_rung(RunSpec.from_conf({**default_conf(), "capacity_ladder": ladder_conf}), option)
    return dict(gke.node_pool_create_request(spec, owner_of(spec)).body["nodePool"])


def test_the_pool_in_the_cloud_is_the_ladders_state() -> None:
    options = [r.capacity for r in RUNGS]
    assert ladder.current_rung(options, None) == 0
    assert ladder.current_rung(options, _pool("flex_start")) == 1
    assert ladder.current_rung(options, _pool("spot")) == 2
    # A pool of an option the ladder does not hold starts the ladder from its first rung.
    assert ladder.current_rung(options, _pool("on_demand")) == 0
    # A kept pool on a later rung is the run's; on the first rung, or off the ladder, it is judged as usual.
    assert ladder.kept_rung(options, "reservation", _pool("spot")) == "spot"
    assert ladder.kept_rung(options, "reservation", _pool("reservation")) is None
    assert ladder.kept_rung(options, "reservation", _pool("on_demand")) is None
    assert ladder.kept_rung(options, "reservation", None) is None


def test_a_failed_delete_blocks_the_next_rung_only_while_the_old_pool_is_there() -> None:
    assert ladder.replaced_pool_blocks("error", _pool("reservation"))
    assert not ladder.replaced_pool_blocks("error", None)
    assert not ladder.replaced_pool_blocks("success", _pool("reservation"))
