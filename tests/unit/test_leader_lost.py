"""When a member's connection closes, does its follower elect at once? (`lost_leader`, pure)

The case that cost a whole election timeout: the other follower saw the leader's connection close
first and asked for votes, so pysyncobj had already forgotten the leader when the close reached
this member.
"""

from __future__ import annotations

from handler.leader_watch import lost_leader

A, B, C = "10.0.0.1:5674", "10.0.0.2:5674", "10.0.0.3:5674"


def test_the_followed_leader_closing_starts_an_election():
    assert lost_leader(False, leader=A, followed=A, lost=A)


def test_the_leader_closing_after_a_vote_request_made_the_leader_unknown_still_starts_one():
    assert lost_leader(False, leader=None, followed=A, lost=A)


def test_another_follower_closing_starts_none():
    assert not lost_leader(False, leader=A, followed=A, lost=B)
    assert not lost_leader(False, leader=None, followed=A, lost=B)


def test_the_old_leader_closing_once_a_new_one_is_known_starts_none():
    assert not lost_leader(False, leader=C, followed=C, lost=A)


def test_a_leader_never_elects_on_a_close():
    assert not lost_leader(True, leader=A, followed=A, lost=B)


def test_a_member_that_never_knew_a_leader_waits_for_its_election_timeout():
    assert not lost_leader(False, leader=None, followed=None, lost=A)
