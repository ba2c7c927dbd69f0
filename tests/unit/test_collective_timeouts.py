"""The ranks' waits: the longer start-up wait until they meet, then collective_timeout_s;
the key named in a timeout's error is the one in force."""

from pretrain.cluster import collectives


def test_the_startup_wait_holds_until_the_ranks_meet():
    assert collectives.use_timeouts(90, 5) == 90  # the process group's timeout at creation
    assert collectives.timeout_in_force() == ("trainer.startup_timeout_s", 90.0)
    collectives.ranks_met()  # no process group in this process: only the record changes
    assert collectives.timeout_in_force() == ("trainer.collective_timeout_s", 5.0)
    assert collectives.use_timeouts(90, 5) == 90  # a new run starts unmet
    assert collectives.timeout_in_force()[0] == "trainer.startup_timeout_s"


def test_a_startup_wait_shorter_than_the_collective_one_is_not_used():
    assert collectives.use_timeouts(30, 600) == 600
    assert collectives.timeout_in_force() == ("trainer.collective_timeout_s", 600.0)
