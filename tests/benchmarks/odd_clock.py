"""A clock under which no reported time can be the difference of two others."""

QUANTITIES = ("total", "forward", "backward")


class OddClock:
    """The k-th reading is k**2 seconds: a call timed between two consecutive readings lasts
    an odd number of seconds, and a difference of two such durations is even."""

    def __init__(self):
        self.readings = -1

    def __call__(self) -> float:
        self.readings += 1
        return float(self.readings**2)


def odd_seconds(ms: float) -> bool:
    """Whether ``ms`` milliseconds are an odd number of whole seconds."""
    return ms / 1e3 == int(ms / 1e3) and int(ms / 1e3) % 2 == 1
