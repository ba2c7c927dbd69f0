"""trainer.hang_timeout_s: checked when composed, 0 or null turns the watchdog off, and the
place a stall names is the caller of the standard library's wait."""

import threading

import pytest

from pretrain.cluster.watchdog import HangWatchdog, main_thread_place, watchdog_callbacks
from pretrain.config import TrainerConfig
from pretrain.errors import ConfigError


def test_a_negative_hang_timeout_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"^trainer\.hang_timeout_s = -1: must be 0 or more"):
        TrainerConfig(hang_timeout_s=-1)


@pytest.mark.parametrize("off", [0, None])
def test_zero_or_null_turns_the_watchdog_off(off, tmp_path):
    assert watchdog_callbacks(TrainerConfig(hang_timeout_s=off), tmp_path) == []


def test_a_timeout_gives_one_watchdog_with_the_startup_allowance(tmp_path):
    (watchdog,) = watchdog_callbacks(
        TrainerConfig(hang_timeout_s=60, startup_timeout_s=90), tmp_path
    )
    assert isinstance(watchdog, HangWatchdog)
    assert (watchdog.timeout_s, watchdog.startup_s) == (60.0, 90.0)
    assert watchdog.records == tmp_path / "stalled"


def test_the_place_named_is_the_waits_caller_not_the_standard_library():
    place: list[str] = []

    def look() -> None:
        place.append(main_thread_place())
        released.set()

    def wait_for_the_thread() -> None:
        threading.Thread(target=look).start()
        released.wait()  # the main thread waits inside threading.py

    released = threading.Event()
    wait_for_the_thread()
    assert place[0].startswith("test_watchdog_config.py:")
    assert place[0].endswith("in wait_for_the_thread")
