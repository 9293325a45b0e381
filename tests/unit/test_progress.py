"""Progress bars of long work: drawn with the time left on a terminal, nothing at all elsewhere."""

import io
import sys
import types

from node.tools.progress import Progress
from pipeline.audit_progress import AuditProgress
from tests.integration.harness import wait_until


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_nothing_is_drawn_and_the_work_s_lines_are_printed_as_they_are(capsys):
    stream = io.StringIO()
    with Progress(3, "nemesis", "round", stream=stream) as progress:
        progress.note("round 1: kill")
        progress.say("round 1 kill seed 7: ok")
        progress.advance()

    assert stream.getvalue() == ""
    assert capsys.readouterr().out == "round 1 kill seed 7: ok\n"


def test_on_a_terminal_the_bar_shows_what_is_done_the_time_left_and_the_note_and_is_cleared_at_the_end():
    stream = Terminal()
    with Progress(4, "nemesis", "round", stream=stream) as progress:
        progress.advance()
        progress.note("round 2: pause")
        progress.advance()
        drawn = stream.getvalue()

    assert "nemesis:  50%" in drawn and "2/4 round" in drawn
    assert "left" in drawn and "round 2: pause" in drawn
    assert stream.getvalue().endswith("\r")  # left=False: the bar's line is wiped when the work ends


def test_a_line_said_while_the_bar_is_drawn_goes_to_stdout_and_the_bar_is_drawn_again(capsys, monkeypatch):
    stream = Terminal()
    monkeypatch.setattr(sys, "stderr", stream)  # the bar's own stream: tqdm clears bars on stdout and stderr
    with Progress(2, "bench", "msg") as progress:
        progress.advance()
        before = len(stream.getvalue())
        progress.say("12:00:00 [grouper] warm-up done")
        after = stream.getvalue()[before:]

    assert capsys.readouterr().out == "12:00:00 [grouper] warm-up done\n"
    assert "bench:  50%" in after  # cleared for the line, then drawn again


class Tracker:
    """Spark's status tracker as the poller reads it: one active stage, 3 of 8 tasks done."""

    def getActiveStageIds(self):
        return [5]

    def getStageInfo(self, stage_id):
        return types.SimpleNamespace(numCompletedTasks=3, numTasks=8) if stage_id == 5 else None


def test_the_audit_shows_its_steps_and_the_running_stage_s_tasks_on_a_terminal():
    spark = types.SimpleNamespace(sparkContext=types.SimpleNamespace(statusTracker=Tracker))
    stream = Terminal()
    with AuditProgress(spark, 2, stream=stream) as progress:
        progress.step("reading the lines")
        progress.step("findings")
        wait_until(lambda: "findings: 3/8 tasks" in stream.getvalue(), "the stage's tasks on the bar")

    assert "audit:  50%" in stream.getvalue()


def test_off_a_terminal_the_audit_polls_nothing():
    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"the tracker was read ({name}) with no terminal to show it on")

    spark = types.SimpleNamespace(sparkContext=types.SimpleNamespace(statusTracker=Untouchable))
    with AuditProgress(spark, 1, stream=io.StringIO()) as progress:
        progress.step("reading the lines")
        assert not progress._poller.is_alive()


def test_a_count_of_messages_is_shown_in_thousands_and_a_count_of_rounds_as_it_is():
    messages, rounds = Terminal(), Terminal()
    with Progress(20_000, "bench", "msg", stream=messages) as progress:
        progress.advance(12_300)
        drawn_messages = messages.getvalue()
    with Progress(2_000, "nemesis", "round", stream=rounds) as progress:
        progress.advance(1_200)
        drawn_rounds = rounds.getvalue()

    assert "12.3k/20.0k msg" in drawn_messages
    assert "1200/2000 round" in drawn_rounds
