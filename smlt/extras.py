"""smlt's optional parts (pyproject.toml's extras): a command whose extra is not installed says
which one to install, before it starts anything."""

from __future__ import annotations

from importlib.util import find_spec

from smlt.runtime.errors import SmltError

# extra -> the modules that mark it installed
MODULES = {
    "local": ("moto", "aws_cdk", "cdk_nag"),
    "deploy": ("aws_cdk", "cdk_nag"),
    "dashboard": ("dash", "plotly"),
}


class MissingExtra(SmltError):
    """The command needs an extra of smlt that is not installed."""


def require(extra: str, what: str) -> None:
    """Raise MissingExtra naming `extra` when one of its modules is missing; `what` needs it."""
    missing = [m for m in MODULES[extra] if find_spec(m) is None]
    if missing:
        raise MissingExtra(
            f"{what} needs smlt's {extra} extra ({', '.join(missing)} not installed): pip install 'smlt[{extra}]'"
        )
