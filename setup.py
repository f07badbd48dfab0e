"""The wheel's one addition to pyproject.toml's build: the project root's files the CDK app reads
(cdk.json's context, the train image's .dockerignore, the layer's requirements) go into the wheel as
infra/project/, where `smlt.project.root()` finds them when smlt runs from an installed wheel."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT_FILES = ("cdk.json", ".dockerignore", "layers/requirements.txt")


class BuildWithRootFiles(build_py):
    def run(self) -> None:
        super().run()
        for name in ROOT_FILES:
            target = Path(self.build_lib) / "infra" / "project" / name
            self.mkpath(str(target.parent))
            self.copy_file(name, str(target))


setup(cmdclass={"build_py": BuildWithRootFiles})
