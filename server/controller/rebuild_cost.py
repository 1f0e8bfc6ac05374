"""What a switch to an engine that is not built yet costs: the seconds the
build takes, and how much slower the serving engine runs meanwhile."""

from __future__ import annotations

from dataclasses import dataclass

SLOWDOWN_WINDOW = 20
"""Requests the build slowdown is (about) a mean over."""


@dataclass
class RebuildCost:
    seconds: float
    """Seconds a build beside the serving engine takes here: the setting until
    one was measured (by ``quickdraft tune``, restored with the profile, or
    live), then a running mean."""
    measured: bool = False
    slowdown: float = 1.0
    """How much slower the serving engine's requests run while another engine
    is built beside it (their TPOT over the model's prediction): 1.0 until
    measured. On 2 CPU cores the build takes the serving engine's CPU (2-3x);
    on a GPU it should be near 1."""
    slowdown_samples: int = 0

    def observe_build(self, seconds: float) -> None:
        """A build took ``seconds``; the first measurement replaces the setting."""
        if seconds > 0:
            self.seconds = 0.5 * (self.seconds + seconds) if self.measured else seconds
            self.measured = True

    def observe_slowdown(self, tpot_s: float, expected_tpot_s: float) -> None:
        """A request served during a build ran at ``tpot_s`` where the model
        predicts ``expected_tpot_s``."""
        if expected_tpot_s <= 0 or tpot_s <= 0:
            return
        ratio = min(10.0, max(0.5, tpot_s / expected_tpot_s))
        self.slowdown_samples += 1
        weight = 1.0 / min(self.slowdown_samples, SLOWDOWN_WINDOW)
        self.slowdown += weight * (ratio - self.slowdown)

    def tpot_if_rebuilt(self, active_tpot_s: float, best_tpot_s: float, horizon_s: float) -> float:
        """Mean TPOT over the load's horizon H if the best is built now: the
        active engine serves the R seconds of the build s times slower, then
        the best serves the rest, (R * s * active + (H - R) * best) / H. A
        warm engine below it wins over the build; a build not below
        ``active_tpot_s`` does not pay (with s = 1 any gain pays; with R = 38 s
        and s = 2 it takes about half the TPOT)."""
        share = min(1.0, self.seconds / horizon_s)
        return share * self.slowdown * active_tpot_s + (1.0 - share) * best_tpot_s

    # -- profile -----------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"rebuild_s": self.seconds, "build_slowdown": self.slowdown}

    def load_dict(self, d: dict) -> None:
        """Figures measured on this hardware last time (missing or invalid ones are skipped)."""
        seconds, slowdown = d.get("rebuild_s"), d.get("build_slowdown")
        if isinstance(seconds, (int, float)) and seconds > 0:
            self.seconds, self.measured = float(seconds), True
        if isinstance(slowdown, (int, float)) and slowdown > 0:
            self.slowdown = float(slowdown)
            self.slowdown_samples = 1  # the next measurement moves it halfway
