"""A clock that moves only when a fake call says how long it took: timings known exactly."""

from __future__ import annotations

from collections.abc import Callable, Iterable


class FakeClock:
    """``clock()`` reads the fake time; a call made by :meth:`call` advances it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.order: list[str] = []

    def __call__(self) -> float:
        return self.now

    def call(self, name: str, durations: Iterable[float]) -> Callable[..., None]:
        """A call that records ``name`` and takes the next of ``durations`` each time (the
        last one forever after); it accepts any arguments."""
        durations = list(durations)

        def fake(*args: object) -> None:
            self.order.append(name)
            self.now += durations.pop(0) if len(durations) > 1 else durations[0]

        return fake
