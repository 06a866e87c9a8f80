"""The model checker's driver (model/check.py): how it reads SPIN's output. No SPIN needed.

The samples are SPIN 6.5.2's own output for model/protocol.pml, trimmed of lines the
driver does not read.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest

from model import check

PASSED = """
(Spin Version 6.5.2 -- 6 December 2019)
\t+ Partial Order Reduction

Full statespace search for:
\tnever claim         \t- (not selected)
\tassertion violations\t+
\tcycle checks       \t- (disabled by -DSAFETY)
\tinvalid end states\t+

State-vector 76 byte, depth reached 310, errors: 0
    11256 states, stored
    12797 states, matched
    24053 transitions (= stored+matched)
    63600 atomic steps
hash conflicts:        55 (resolved)

Stats on memory usage (in Megabytes):
    1.116\tequivalent memory usage for states (stored*(State-vector + overhead))
    1.122\tactual memory usage for states
    8.000\tmemory used for hash table (-w20)
    5.341\tmemory used for DFS stack (-m100000)
   14.415\ttotal actual memory usage

pan: elapsed time 0.02 seconds
pan: rate    562800 states/second
"""

VIOLATED = """
Depth=      10 States=       49 Transitions=       49 Memory=     8.293\t
Depth=      30 States= 3.17e+03 Transitions= 3.65e+03 Memory=     8.684\t
pan:1: assertion violated ( !(1)|| !(op_claimed)) (at depth 30)
pan: wrote protocol.pml.trail

(Spin Version 6.5.2 -- 6 December 2019)
Warning: Search not completed
\t+ Breadth-First Search
\t+ Partial Order Reduction

State-vector 76 byte, depth reached 30, errors: 1
     3338 states, stored
\t     894 nominal states (stored-atomic)
      512 states, matched
     3850 transitions (= stored+matched)

Stats on memory usage (in Megabytes):
    8.684\ttotal actual memory usage

pan: elapsed time 0.01 seconds
"""

CYCLE = """
pan:1: acceptance cycle (at depth 102)
pan: wrote protocol.pml.trail

(Spin Version 6.5.2 -- 6 December 2019)
Warning: Search not completed
\t+ Partial Order Reduction

Full statespace search for:
\tnever claim         \t+ (settles)
\tacceptance   cycles \t+ (fairness disabled)

State-vector 84 byte, depth reached 397, errors: 1
    29907 states, stored (59787 visited)
   152092 states, matched
   211879 transitions (= visited+matched)

Stats on memory usage (in Megabytes):
   11.269\ttotal actual memory usage

pan: elapsed time 0.66 seconds
"""

CUT_SHORT = """
error: max search depth too small

(Spin Version 6.5.2 -- 6 December 2019)
\t+ Partial Order Reduction

State-vector 76 byte, depth reached 49, errors: 0
       77 states, stored
       71 states, matched
      148 transitions (= stored+matched)

Stats on memory usage (in Megabytes):
    8.293\ttotal actual memory usage

pan: elapsed time 0 seconds
"""

REPLAY = """ltl settles: <> ([] ((((st==3)) || ((st==4))) && ((acked[0]))))
              @ t1: receives message 0
              @ t1: claims the job (attempt 1)
                  @ operator: jobs show
              @ t1: its process crashes
              @ t1: receives message 0
              @ t1: claims the job (attempt 2)
                  @ operator: jobs release --expect-epoch
spin: protocol.pml:725, Error: assertion violated
spin: text of failed assertion: assert((!(1)||!(op_claimed)))
spin: trail ends after 31 steps
#processes: 4
\t\tst = 2
 31:\tproc  3 (Operator:1) protocol.pml:175 (state 19)
"""

CYCLE_REPLAY = """ltl settles: <> ([] ((((st==3)) || ((st==4)))))
Never claim moves to line 3\t[(!((((st==3)||(st==4)))))]
                  @ t1: receives message 0
Never claim moves to line 8\t[(1)]
              @ t0: claims the job (attempt 1)
  <<<<<START OF CYCLE>>>>>
Never claim moves to line 3\t[(!((((st==3)||(st==4)))))]
spin: trail ends after 104 steps
"""


def test_a_finished_search_holds_with_its_numbers() -> None:
    result = check.parse_pan(PASSED)

    assert result == check.PanResult(
        errors=0,
        violation="",
        stored=11256,
        transitions=24053,
        depth=310,
        seconds=0.02,
        memory_mb=14.415,
        complete=True,
    )
    assert result.holds


def test_a_violation_is_named_by_pans_first_error_line() -> None:
    result = check.parse_pan(VIOLATED)

    assert result.errors == 1
    assert result.violation == "assertion violated ( !(1)|| !(op_claimed)) (at depth 30)"
    assert (result.stored, result.transitions, result.depth) == (3338, 3850, 30)
    assert not result.holds


def test_a_liveness_search_counts_the_states_stored_not_visited() -> None:
    result = check.parse_pan(CYCLE)

    assert result.violation == "acceptance cycle (at depth 102)"
    assert (result.stored, result.transitions, result.memory_mb) == (29907, 211879, 11.269)
    assert not result.holds


def test_a_search_cut_short_by_its_depth_limit_does_not_hold() -> None:
    result = check.parse_pan(CUT_SHORT)

    assert result.errors == 0
    assert not result.complete
    assert not result.holds


def test_output_without_a_search_summary_is_refused() -> None:
    with pytest.raises(ValueError, match="not the output of a finished pan run"):
        check.parse_pan("pan: out of memory\n")


def test_a_trail_is_told_by_the_models_narration() -> None:
    story, line = check.trail_story(REPLAY)

    assert story == [
        "t1: receives message 0",
        "t1: claims the job (attempt 1)",
        "operator: jobs show",
        "t1: its process crashes",
        "t1: receives message 0",
        "t1: claims the job (attempt 2)",
        "operator: jobs release --expect-epoch",
    ]
    assert line == 725


def test_a_cycles_trail_marks_where_the_cycle_starts() -> None:
    story, line = check.trail_story(CYCLE_REPLAY)

    assert story == [
        "t1: receives message 0",
        "t0: claims the job (attempt 1)",
        "from here on, the run repeats forever:",
    ]
    assert line is None


def test_the_property_of_a_failed_assertion_is_read_from_its_line() -> None:
    text = "inline land(t) {\n    fenced(OURS(t));\n    lastw = t;\n}\n"

    assert check.property_at(text, 2) == "fenced"
    assert check.property_at(text, 3) is None
    assert check.property_at(text, 99) is None
    assert check.failed_assertion(text, 2) == "fails: fenced(OURS(t)); (model/protocol.pml:2)"


def test_every_property_and_mutant_the_driver_names_is_in_the_model() -> None:
    model = check.MODEL.read_text(encoding="utf-8")
    lines = model.splitlines()

    for prop in check.PROPERTIES:
        if prop.liveness:
            assert f"ltl {prop.macro} " in model
            continue
        assert f"#ifndef {prop.macro}\n" in model
        used = [n for n in range(1, len(lines) + 1) if check.property_at(model, n) == prop.name]
        assert len(used) > 1, f"{prop.name}: its assertion macro is defined but never used"
    for mutant in check.MUTANTS:
        assert f"#ifdef {mutant.macro}\n" in model or f"#ifndef {mutant.macro}\n" in model


def test_without_spin_the_driver_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(shutil, "which", lambda _name: None)

    assert check.main([]) == 2
    assert "install Debian's spin and gcc" in capsys.readouterr().err


LISTING = """proctype Operator
\tstate  76 -(tr  11)-> state   2  [id 2915 tp   2] [A-e-G] protocol.pml:994 => ((phase==0))
\tstate   2 -(tr  12)-> state   3  [id 2916 tp   2] [A---G] protocol.pml:995 => phase = 1
\tstate  35 -(tr  18)-> state  10  [id 2923 tp   2] [A---G] protocol.pml:1004 => ((st==3))
\tstate  35 -(tr   2)-> state  12  [id 2925 tp   2] [A---G] protocol.pml:1004 => else
\tstate  12 -(tr   1)-> state  76  [id 2926 tp   2] [A---G] protocol.pml:1006 => goto done
\tstate  10 -(tr   2)-> state  76  [id 2927 tp   2] [A---G] protocol.pml:1008 => else
init
\tstate   1 -(tr   5)-> state   2  [id 2990 tp   2] [A---G] protocol.pml:1044 => published[0] = 1
claim settles
\tstate   5 -(tr  60)-> state   5  [id 3001 tp   2] [----G] _spin_nvr.tmp:3 => (1)
"""

PEGS = """
unreached in proctype Operator
\tprotocol.pml:1040, state 79, "-end-"
\tprotocol.pml:1006, state 12, "goto done"
\t(2 of 79 states)
unreached in init
\t(0 of 7 states)
unreached in claim settles
\t_spin_nvr.tmp:3, state 5, "(1)"
\t(3 of 13 states)

pan: elapsed time 4.22 seconds
Peg Counts (transitions executed):
2371042\ttrans    1 (null):0
2436481\ttrans    2 (null):0
    1\ttrans    5 protocol.pml:1044
  812\ttrans   11 protocol.pml:994
  812\ttrans   12 protocol.pml:995
"""


def test_the_transitions_of_the_models_processes_are_read_from_pans_listing() -> None:
    transitions = check.parse_transitions(LISTING)

    assert transitions[0] == check.Transition("Operator", 76, 11, 2, 994, "((phase==0))")
    assert [(t.proctype, t.forward) for t in transitions] == [
        ("Operator", 11),
        ("Operator", 12),
        ("Operator", 18),
        ("Operator", 2),
        ("Operator", 1),
        ("Operator", 2),
        ("init", 5),
    ]  # the never claim's are not the model's


def test_peg_counts_and_unreached_states_are_read_from_pans_output() -> None:
    assert check.parse_pegs(PEGS) == {1: 2371042, 2: 2436481, 5: 1, 11: 812, 12: 812}
    assert check.parse_unreached(PEGS) == {("Operator", 79), ("Operator", 12)}
    with pytest.raises(ValueError, match="-DPEG"):
        check.parse_pegs("pan: elapsed time 1 seconds\n")


def test_dead_code_is_every_statement_no_run_takes() -> None:
    dead = check.dead_code(
        check.parse_transitions(LISTING), check.parse_pegs(PEGS), check.parse_unreached(PEGS)
    )

    # st==3 never ran (no peg count); the else beside it leads alone to state 12, which no
    # run reached; goto done leaves that unreached state; the else at 1008 leads to state 76,
    # which others lead to as well: whether it was taken cannot be seen.
    assert dead == [
        check.Dead("Operator", 1004, "((st==3))"),
        check.Dead("Operator", 1004, "else"),
        check.Dead("Operator", 1006, "goto done"),
        check.Dead("Operator", 1008, "else", seen=False),
    ]


def test_copies_of_one_statement_count_together() -> None:
    """An inline's statement is one per call: it is dead only when no copy runs."""
    copies = [
        check.Transition("Thread", 3, 40, 4, 243, "rec = (rec|1)"),
        check.Transition("Thread", 9, 41, 10, 243, "rec = (rec|1)"),
    ]

    assert check.dead_code(copies, {41: 3}, set()) == []
    assert check.dead_code(copies, {}, set()) == [check.Dead("Thread", 243, "rec = (rec|1)")]


def test_a_property_implied_by_another_says_so() -> None:
    implied = {p.name: p.implied_by for p in check.PROPERTIES if p.implied_by}
    assert implied == {"failed-xor-completed": "fenced"}
    assert set(implied.values()) <= {p.name for p in check.PROPERTIES}


def test_an_equivalent_mutant_must_leave_the_state_space_as_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """It holds with the model's own states and transitions, or the check fails."""
    mutant = next(m for m in check.MUTANTS if m.equivalent)
    model = check.parse_pan(PASSED)
    grown = dataclasses.replace(model, stored=model.stored + 1)

    def search(result: check.PanResult) -> Any:
        return lambda *_: check.Check("m", result, [], None, 0.0)

    monkeypatch.setattr(check, "run_search", search(model))
    assert check.check_mutant(mutant, 2, tmp_path, lambda: model).ok
    monkeypatch.setattr(check, "run_search", search(grown))
    verdict = check.check_mutant(mutant, 2, tmp_path, lambda: model)
    assert (verdict.ok, verdict.text) == (False, "NOT EQUIVALENT")
