"""The decision rule's tuned constants, in one typed object (`PlannerConfig`).

Each field says what it means and which decision record set it (`docs/decisions/NNNN-*.md`, where
the measured numbers are). The defaults are the deployed planner's. A variant is a JSON file of the
fields it changes: `bench/planner_bench.py --config variant.json` replays the benchmark with it, and
`decide(..., config=...)` plans with it; nothing patches module constants.

The active config is a context variable: `decide` sets it for its call, `using` for a block (the
benchmark's world calls `decide` through the simulator without passing one).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from smlt.runtime.errors import SmltError
from smlt.runtime.validation import describe


def _d(record: str, text: str) -> dict:
    return {"description": text, "json_schema_extra": {"decision": record}}


class PlannerConfigError(SmltError):
    """A variant file that is not a PlannerConfig."""


class PlannerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # The candidate grids (docs/planner.md, "The decision rule" 2).
    n_set: tuple[int, ...] = Field(
        (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256, 384, 512, 768, 1000),
        **_d("-", "worker counts the planner considers (within workers.min/max, plus the job's own)"),
    )
    k_set: tuple[int, ...] = Field(
        (1, 2, 3, 5, 8, 12, 20, 30, 50, 80, 120, 200, 300, 500, 800, 1200),
        **_d("-", "local step counts the planner considers (plus the job's own)"),
    )
    # Exploration.
    explore_kappa: float = Field(1.0, **_d("0008", "the objective's discount per unit of relative worker-time sd"))
    explore_min_rounds: float = Field(
        5.0, **_d("0008", "explore only while at least this many median rounds remain (to use what is learned)")
    )
    # Safety levels.
    feasible_qs: tuple[float, ...] = Field(
        (0.9, 0.7, 0.5, 0.2), **_d("0005", "percentiles of the rounds needed a whole plan must fit, tried in order")
    )
    budget_q: float = Field(
        0.5, **_d("0005", "the percentile every budget test uses (the hard guard already bounds spending)")
    )
    backup_qs: tuple[float, ...] = Field(
        (0.9, 0.7), **_d("0005", "slow-progress percentiles a cost plan's way out must still cover")
    )
    time_for_cost: float = Field(
        0.1, **_d("0005", "with a deadline, the fastest plan within this share of the cheapest's expected cost")
    )
    # Admission and giving up.
    admit_q: float = Field(
        0.1, **_d("0006", "a job is refused only when even this optimistic percentile of the rounds needed misses")
    )
    advise_q: float = Field(0.5, **_d("0006", "the percentile of the deadline and budget a refusal advises"))
    p_never_give_up: float = Field(
        0.99, **_d("0006", "mid-run, the probability the plateau is below the target before a run may be given up")
    )
    min_obs_to_give_up: int = Field(5, **_d("0006", "validation points before a running job may be given up"))
    midrun_optimism: float = Field(
        0.5, **_d("0006", "mid-run, given up only if this share of the p10 rounds needed would not fit either")
    )
    stall_rounds: int = Field(
        4, **_d("0006", "evaluations without a rise beyond noise that make a stall (`stall.stalled`'s default window)")
    )
    stall_z: float = Field(
        2.0, **_d("0006", "a rise counts when above this many sd of the difference of two validation measurements")
    )
    plateau_rounds: int = Field(8, **_d("0006", "evaluations without a rise before a run may be given up"))
    averaging_stall_rounds: int = Field(
        1, **_d("-", "a stall over this many evaluations of averaged models caps n at one (docs/planner.md, step 2)")
    )
    # Step bounds.
    step_up_x: int = Field(4, **_d("0003", "n and k of the next round at most this many times the largest tried"))
    first_steps_up_x: int = Field(
        16, **_d("0003", "round 0 of a cost job: k up to this many times the job's (step_up_x squared)")
    )
    # Round length.
    short_round_every: int = Field(
        2,
        **_d("-", "from round 3, every this many rounds a long plan trains a shorter round (docs/planner.md, step 4)"),
    )
    short_round_x: int = Field(4, **_d("-", "the shorter round trains k / this many steps"))
    short_round_min_k: int = Field(120, **_d("-", "only plans of at least this many local steps get a shorter round"))
    short_round_min_left: float = Field(
        8.0, **_d("-", "... and only with at least this many median rounds left to use what it shows")
    )
    overhead_x: float = Field(
        2.0, **_d("-", "from round 1, k stops where a round's compute reaches this multiple of its overhead (seconds)")
    )
    cost_overhead_x: float = Field(1.0, **_d("-", "the same in dollars, when money is the scarcer limit"))

    @property
    def speed_backup_qs(self) -> tuple[float, ...]:
        """The speed objective's cheap way out, at the budget's percentile."""
        return (self.budget_q,)

    @classmethod
    def from_file(cls, path: Path) -> PlannerConfig:
        """A variant file: a JSON object of the fields it changes; PlannerConfigError names the
        file and the field otherwise."""
        try:
            raw = json.loads(Path(path).read_text())
        except OSError as e:
            raise PlannerConfigError(f"planner config: cannot read {path}: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise PlannerConfigError(f"planner config: {path} is not valid JSON ({e})") from None
        try:
            return cls.model_validate(raw)
        except ValidationError as e:
            raise PlannerConfigError(f"planner config: {path}: {describe(e, '(top level)', first=True)}") from None


DEFAULT = PlannerConfig()
_ACTIVE: contextvars.ContextVar[PlannerConfig] = contextvars.ContextVar("planner_config", default=DEFAULT)


def active() -> PlannerConfig:
    """The config the decision rule reads now."""
    return _ACTIVE.get()


@contextlib.contextmanager
def using(config: PlannerConfig | None) -> Iterator[PlannerConfig]:
    """Plan with `config` inside the block (None: keep the active one)."""
    if config is None:
        yield active()
        return
    token = _ACTIVE.set(config)
    try:
        yield config
    finally:
        _ACTIVE.reset(token)
