"""The package's metadata: pyproject.toml says which versions smlt accepts (ranges, heavy parts as
extras), constraints.txt the exact ones it is developed and tested with, each inside its range;
torch's range admits only 2.13 (the CPU build here: another version is a multi-GB CUDA download)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from smlt.extras import MODULES
from smlt.local.patches import SUPPORTED_MOTO

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = ("local", "deploy", "dashboard", "tracking", "onnx")


def _requirements() -> dict[str, list[Requirement]]:
    """Every requirement on another package, by extra ("" for the core)."""
    groups = {"": PROJECT["dependencies"], **PROJECT["optional-dependencies"]}
    return {
        extra: [r for r in map(Requirement, reqs) if canonicalize_name(r.name) != "smlt"]
        for extra, reqs in groups.items()
    }


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"constraints.txt: {line} is not an exact pin"
            pins[canonicalize_name(req.name)] = Version(spec.version)
    return pins


def test_every_requirement_is_a_range_with_its_pin_inside():
    pins = _pins()
    for extra, reqs in _requirements().items():
        for r in reqs:
            name = canonicalize_name(r.name)
            assert name in pins, f"{r} ({extra or 'core'}): no pin in constraints.txt"
            assert not any(s.operator == "==" for s in r.specifier), (
                f"{r}: a range in pyproject.toml, the pin in constraints.txt"
            )
            assert r.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} is outside {r}"


def test_every_pin_is_a_requirement():
    named = {canonicalize_name(r.name) for reqs in _requirements().values() for r in reqs}
    assert set(_pins()) - named == set()


def test_the_heavy_parts_are_extras_and_the_core_runs_no_engine():
    reqs = _requirements()
    assert set(EXTRAS) <= set(reqs)
    core = {canonicalize_name(r.name) for r in reqs[""]}
    assert core.isdisjoint({"moto", "aws-cdk-lib", "cdk-nag", "dash", "tensorboard", "onnx", "onnxruntime"})
    local = {canonicalize_name(r.name) for r in reqs["local"]}
    assert "moto" in local and "smlt[deploy]" in PROJECT["optional-dependencies"]["local"]
    # smlt.extras names what each extra installs
    assert set(MODULES) <= set(EXTRAS)


def test_torch_stays_the_cached_cpu_build():
    (torch,) = [r for r in _requirements()[""] if r.name == "torch"]
    assert torch.specifier.contains("2.13.0") and not torch.specifier.contains("2.14.0")
    assert not torch.specifier.contains("2.12.1")
    (vision,) = [r for r in _requirements()[""] if r.name == "torchvision"]
    assert vision.specifier.contains("0.28.0") and not vision.specifier.contains("0.29.0")
    assert _pins()["torch"] == Version("2.13.0") and _pins()["torchvision"] == Version("0.28.0")


def test_the_local_extras_moto_is_one_the_engines_patches_support():
    (moto,) = [r for r in _requirements()["local"] if r.name == "moto"]
    for v in ("5.2.5", "5.2.99", "5.3.0", "5.1.9"):
        if moto.specifier.contains(v):
            assert Version(v) in SUPPORTED_MOTO, f"moto {v}: allowed by pyproject.toml, not by smlt.local.patches"
    assert _pins()["moto"] in SUPPORTED_MOTO


def test_make_install_installs_with_the_constraints():
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install -q --disable-pip-version-check -e '.[dev]' -c constraints.txt" in makefile


def _without(monkeypatch, *modules: str) -> None:
    import smlt.extras

    real = smlt.extras.find_spec
    monkeypatch.setattr(smlt.extras, "find_spec", lambda name: None if name in modules else real(name))


def test_run_local_without_the_local_extra_names_it_before_anything_starts(tmp_path, capsys, monkeypatch):
    from smlt.cli import main

    _without(monkeypatch, "moto")
    job = tmp_path / "digits.json"
    job.write_text((ROOT / "examples" / "digits.json").read_text())
    assert main(["run", "--local", str(job), "--out", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == (
        "error: the local engine needs smlt's local extra (moto not installed): pip install 'smlt[local]'\n"
    )
    assert not (tmp_path / "out").exists()


def test_the_dashboard_without_its_extra_names_it(capsys, monkeypatch):
    from smlt.cli import main

    _without(monkeypatch, "dash", "plotly")
    assert main(["dashboard", "--port", "0"]) == 1
    assert capsys.readouterr().err == (
        "error: smlt dashboard needs smlt's dashboard extra (dash, plotly not installed): pip install 'smlt[dashboard]'\n"
    )
