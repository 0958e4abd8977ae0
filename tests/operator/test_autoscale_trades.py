"""A trade between the roles is a scale-down of the giver: it obeys the giver's down window (decision.hold_trades)."""

from __future__ import annotations

from dataclasses import replace

from atom_operator.autoscale.decision import State, hold_trades
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.operator.test_autoscale_decision import make_policy

WINDOW = 300.0


def _policy():
    return make_policy(
        decode={"minReplicas": 1, "maxReplicas": 12, "targetOccupancyPercent": 80},
        prefill={"minReplicas": 1, "maxReplicas": 12, "targetUtilizationPercent": 70},
        ratio=None, npuBudget=None, behavior={"scaleDown": {"stabilizationWindowSeconds": int(WINDOW)}},
    )  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 6), st.integers(1, 6), st.integers(0, 5), st.lists(st.integers(1, 8), min_size=1, max_size=20),
)  # fmt: skip
def test_a_giver_gives_up_no_pod_below_what_its_window_shared_it(giver, taker, cut, earlier) -> None:
    """However the room is shared this interval, the giver keeps the largest count the sharing gave it over its
    window (its own stabilization), and the taker grows only into what that leaves within the room."""
    p = _policy()
    now = 1000.0
    history = tuple((now - WINDOW + 10 * (i + 1), n) for i, n in enumerate(earlier))
    state = State(started=0.0, shared={"decode": history, "prefill": ()})
    room = giver + taker
    shared = (taker + min(cut, giver - 1), giver - min(cut, giver - 1))  # prefill takes what decode gives
    (prefill, decode), _ = hold_trades(shared, (taker, giver), (12, giver), state, p, now, room)
    floor = min(giver, max([shared[1], *earlier]))
    assert decode >= floor
    assert prefill + decode <= room
    assert prefill >= taker  # the taker never shrinks for it


def test_a_full_node_trades_once_the_taker_need_holds_for_the_givers_window() -> None:
    """Decode 5, prefill 3 on a node of 8; prefill's need asks for decode's NPU at every decision from t=0: the
    trade waits for decode's window, then happens once, and stays."""
    p = _policy()
    before = tuple((float(t), 5) for t in range(-300, 0, 15))  # decode kept its 5 until the need came
    state, pairs = State(started=-1000.0, shared={"decode": before, "prefill": ()}), []
    current = (3, 5)
    for t in range(0, 600, 15):
        pair, shared = hold_trades((4, 4), current, (4, 5), state, p, float(t), 8)
        state = replace(state, shared=shared)
        pairs.append((t, pair))
        current = pair
    changes = [(t, pair) for (t, pair), (_, before) in zip(pairs[1:], pairs, strict=False) if pair != before]
    assert pairs[0][1] == (3, 5)
    assert len(changes) == 1 and changes[0][1] == (4, 4)
    assert changes[0][0] >= WINDOW - 15  # every reading of the window (one a decision) asked for it


def test_one_interval_of_the_taker_need_cordons_nothing() -> None:
    p = _policy()
    history = tuple((t, 5) for t in range(700, 1000, 15))
    state = State(started=0.0, shared={"decode": history, "prefill": ()})
    (prefill, decode), _ = hold_trades((4, 4), (3, 5), (4, 5), state, p, 1000.0, 8)
    assert (prefill, decode) == (3, 5)
