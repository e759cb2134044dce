"""A trial's status (store/status.py): the table of moves the ledger makes, and the ledger refusing a move the
table does not allow, on a real SQLite ledger (no Ray)."""

import pytest
from conftest import TINY_STUDY

from studyrunner.store import STATUSES, IllegalTransition, Ledger, TrialStatus
from studyrunner.store import status as st
from studyrunner.study import compile_study, loads

ENDED = (TrialStatus.SUCCEEDED, TrialStatus.FAILED, TrialStatus.DIVERGED)


def test_the_statuses_are_the_ledgers_strings_in_the_status_tables_order():
    assert [str(s) for s in STATUSES] == ["pending", "running", "succeeded", "failed", "diverged", "cancelled"]
    assert TrialStatus.FAILED == "failed" and f"{TrialStatus.DIVERGED}" == "diverged"
    assert {"pending": 1}[TrialStatus.PENDING] == 1  # a row's plain string and the member are one key
    assert set(st.TRANSITIONS) == set(STATUSES)


def test_every_status_is_reachable_from_pending():
    seen, todo = {TrialStatus.PENDING}, [TrialStatus.PENDING]
    while todo:
        for nxt in st.TRANSITIONS[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert seen == set(STATUSES)


def test_an_ended_trial_leaves_its_status_only_through_a_new_attempt():
    for status in ENDED:
        assert st.TRANSITIONS[status] == {TrialStatus.RUNNING}, status
        assert not any(status.can_become(other) for other in STATUSES if other != TrialStatus.RUNNING)
    # an unfinished trial ends (a pending or cancelled one when its attempt's lease was lost while it trained);
    # a retried attempt keeps it running; an interrupted one goes back to pending
    assert [s for s in STATUSES if any(s.can_become(e) for e in ENDED)] == [
        TrialStatus.PENDING,
        TrialStatus.RUNNING,
        TrialStatus.CANCELLED,
    ]
    assert TrialStatus.RUNNING.can_become("running") and TrialStatus.RUNNING.can_become(TrialStatus.PENDING)
    assert TrialStatus.CANCELLED.can_become("pending") and not TrialStatus.PENDING.can_become("pending")


def test_finished_and_unsuccessful():
    assert [s for s in STATUSES if s.finished] == list(ENDED) == list(st.FINISHED)
    assert [s for s in STATUSES if s.unsuccessful] == [TrialStatus.FAILED, TrialStatus.DIVERGED]
    assert list(st.UNSUCCESSFUL) == [TrialStatus.FAILED, TrialStatus.DIVERGED]
    assert set(st.UNFINISHED) == set(STATUSES) - set(ENDED)
    assert st.SUBMIT_RUNS == (TrialStatus.PENDING, TrialStatus.CANCELLED)
    assert not TrialStatus.CANCELLED.finished and not TrialStatus.SUCCEEDED.unsuccessful


@pytest.fixture
def tiny(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    compiled = compile_study(loads(TINY_STUDY))
    ledger.register(compiled)
    return ledger, [t.trial_key for t in compiled.trials]


def _row(ledger, key):
    (row,) = ledger.trials("tiny", [key])
    return row


def test_the_ledger_makes_the_moves_of_a_trials_life(tiny):
    ledger, keys = tiny
    sub = ledger.open_submission("tiny", "submit")
    assert sorted(ledger.claim("tiny", keys, sub)) == sorted(keys)  # a claim changes no status
    assert {r.status for r in ledger.trials("tiny")} == {TrialStatus.PENDING}
    ledger.start_attempt(keys[0], sub)  # pending -> running
    ledger.start_attempt(keys[0], sub)  # running -> running: a retried attempt
    ledger.finish(keys[0], TrialStatus.SUCCEEDED, metrics={"eval_accuracy": 0.5})  # running -> succeeded
    ledger.start_attempt(keys[1], sub)
    assert sorted(ledger.release(sub)) == sorted(keys[1:])  # running and pending -> pending
    assert [_row(ledger, k).status for k in keys] == ["succeeded", "pending", "pending", "pending"]
    ledger.request_cancel("tiny")  # unheld pending -> cancelled
    assert [_row(ledger, k).status for k in keys] == ["succeeded", "cancelled", "cancelled", "cancelled"]
    again = ledger.open_submission("tiny", "rerun")
    assert sorted(ledger.claim("tiny", keys, again, statuses=STATUSES)) == sorted(keys)
    ledger.start_attempt(keys[0], again)  # succeeded -> running: a rerun's new attempt
    ledger.start_attempt(keys[1], again)  # cancelled -> running
    assert sorted(ledger.release(again)) == sorted(keys)  # cancelled -> pending, running -> pending
    assert {r.status for r in ledger.trials("tiny")} == {TrialStatus.PENDING}


def test_an_ended_trial_is_not_ended_again_and_a_lost_lease_still_records_its_outcome(tiny):
    ledger, keys = tiny
    # the attempt's driver was reaped as silent (the trial went back to pending) yet it finished: kept
    ledger.finish(keys[0], TrialStatus.SUCCEEDED, metrics={"eval_accuracy": 0.5})
    row = _row(ledger, keys[0])
    assert (row.status, row.metrics) == ("succeeded", {"eval_accuracy": 0.5})

    ledger.mark_running(keys[1])
    ledger.mark_succeeded(keys[1], {"eval_accuracy": 0.5})
    with pytest.raises(IllegalTransition, match=r"from 'succeeded' to 'failed'"):
        ledger.mark_failed(keys[1], "RuntimeError: a second ending")
    row = _row(ledger, keys[1])
    assert (row.status, row.error, row.metrics) == ("succeeded", None, {"eval_accuracy": 0.5})
    assert [a.status for a in ledger.attempts(keys[1])] == ["succeeded"]


def test_finishing_with_a_status_that_is_no_outcome_is_refused(tiny):
    ledger, keys = tiny
    ledger.mark_running(keys[0])
    with pytest.raises(ValueError, match="pending is not an outcome"):
        ledger.finish(keys[0], TrialStatus.PENDING)
    assert _row(ledger, keys[0]).status == "running"


def test_a_bulk_move_the_table_forbids_is_refused_naming_the_trial(tiny, monkeypatch):
    """Were a release to move a running trial where the table forbids it, the ledger says which trial and
    rolls the release back (the table here is narrowed to make the ledger's own move an illegal one)."""
    ledger, keys = tiny
    sub = ledger.open_submission("tiny", "submit")
    ledger.claim("tiny", keys[:2], sub)
    ledger.start_attempt(keys[0], sub)
    narrowed = st.TRANSITIONS[TrialStatus.RUNNING] - {TrialStatus.PENDING}
    monkeypatch.setitem(st.TRANSITIONS, TrialStatus.RUNNING, narrowed)
    with pytest.raises(IllegalTransition, match=rf"trial {keys[0]}: .* from 'running' to 'pending' \(release\)"):
        ledger.release(sub)
    assert [(_row(ledger, k).status, _row(ledger, k).owner) for k in keys[:2]] == [("running", sub), ("pending", sub)]
    monkeypatch.undo()
    assert sorted(ledger.release(sub)) == sorted(keys[:2])
