"""What the library tells the user while it works, as log records; the CLI (smlt.cli) prints
their messages as the lines users see. Without the CLI nothing is printed (no handler)."""

from __future__ import annotations

import logging

# per-round lines, plan changes, engine start and the run's summary: `--quiet` drops these
progress = logging.getLogger("smlt.runtime.progress")
# one-off lines (a dataset prepared, a run started, a trigger fired): always shown
notice = logging.getLogger("smlt.notice")
