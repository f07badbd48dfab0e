"""What a user's code imports that the train_step image cannot: found in the packaged zip before
anything is stored or started, so a model that imports `einops` or `timm` from the laptop's
environment is named by `smlt start` (refused) and `smlt run --local` (a warning: it runs here,
it would fail on AWS), not by every worker of the first round.

The files read are those importing the job's entry points runs (the model's and the transform's
modules, their packages' `__init__.py`, the package's modules they import, transitively): a
plotting script beside them is not the workers' concern. An import counts unless it is inside a
`try` that catches ImportError (an optional dependency) or under `if TYPE_CHECKING:`. A module is available
when it is in Python's standard library, in the zip itself (a pure-Python package copied beside
the user's own), or installed in the image (IMAGE_MODULES: the top-level names of the pinned
distributions of lambdas/train_step/Dockerfile and layers/requirements.txt and of what they
require; tests/unit/test_usercode_image.py recomputes it from the installed metadata).
"""

from __future__ import annotations

import ast
import io
import sys
import zipfile
from dataclasses import dataclass

from smlt.runtime.usercode import IMAGE_PACKAGES

# Third-party top-level modules the image installs (torch, torchvision, Pillow, pyarrow and the
# layer's requirements, with their dependencies).
IMAGE_MODULES = frozenset(
    {
        "PIL",
        "annotated_types",
        "aws_lambda_powertools",
        "boto3",
        "botocore",
        "dateutil",
        "dotenv",
        "dynamodb_json",
        "et_xmlfile",
        "filelock",
        "fsspec",
        "functorch",
        "hiredis",
        "isympy",
        "jinja2",
        "jmespath",
        "markupsafe",
        "mpmath",
        "networkx",
        "numpy",
        "openpyxl",
        "pyarrow",
        "pydantic",
        "pydantic_core",
        "pydantic_settings",
        "redis",
        "s3transfer",
        "safetensors",
        "setuptools",
        "simplejson",
        "six",
        "sympy",
        "torch",
        "torchgen",
        "torchvision",
        "typing_extensions",
        "typing_inspection",
        "urllib3",
    }
)
_OPTIONAL = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


@dataclass(frozen=True)
class ForeignImport:
    """An import the image cannot satisfy: where (the file's name in the package, the line) and what."""

    file: str
    line: int
    module: str

    def __str__(self) -> str:
        return f"{self.file}, line {self.line}: import {self.module!r}"


def foreign_imports(package: bytes, entry_points: list[str]) -> list[ForeignImport]:
    """The unconditional imports of modules the image does not have, in the files of a packaged
    zip (smlt.runtime.usercode.package_code) that importing the entry points (`pkg.module:fn`)
    runs: their modules, their packages' `__init__.py` files and, transitively, the package's
    modules they import. A file Python cannot parse is left to the model check (its SyntaxError)."""
    with zipfile.ZipFile(io.BytesIO(package)) as zf:
        sources = {n: zf.read(n) for n in zf.namelist() if n.endswith(".py")}
    own = {n.split("/")[0].removesuffix(".py") for n in sources}
    available = set(sys.stdlib_module_names) | IMAGE_MODULES | IMAGE_PACKAGES | own
    found: list[ForeignImport] = []
    todo = [e.partition(":")[0] for e in entry_points]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        for name, is_package in _files_of(module, sources):
            if name in seen:
                continue
            seen.add(name)
            try:
                tree = ast.parse(sources[name], filename=name)
            except (SyntaxError, ValueError):
                continue
            here = module if is_package else module.rpartition(".")[0]
            for line, imported, names in _required(tree, here):
                if imported.split(".")[0] not in available:
                    found.append(ForeignImport(name, line, imported))
                elif imported.split(".")[0] in own:
                    todo.append(imported)
                    todo.extend(f"{imported}.{n}" for n in names)  # `from pkg import module`
    return sorted(found, key=lambda f: (f.file, f.line))


def _files_of(module: str, sources: dict[str, bytes]) -> list[tuple[str, bool]]:
    """(file in the zip, is a package's `__init__.py`) that importing `module` runs: each parent
    package's `__init__.py`, then the module's own file (none when it is not in the zip)."""
    parts = module.split(".")
    out = []
    for i in range(1, len(parts) + 1):
        base = "/".join(parts[:i])
        if f"{base}/__init__.py" in sources:
            out.append((f"{base}/__init__.py", True))
        elif i == len(parts) and f"{base}.py" in sources:
            out.append((f"{base}.py", False))
    return out


def _required(tree: ast.AST, package: str) -> list[tuple[int, str, list[str]]]:
    """(line, module, names imported from it) of every import outside an ImportError guard or
    TYPE_CHECKING; a relative import resolved against `package` (the importing module's)."""
    out: list[tuple[int, str, list[str]]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child)
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
            if node.level == 0 and node.module:
                out.append((node.lineno, node.module, names))
            elif node.level > 0:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1] if package else []
                base = ".".join([*parent, *([node.module] if node.module else [])])
                if base:
                    out.append((node.lineno, base, names))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return sorted(out)


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(k, ast.Name) and k.id in _OPTIONAL for k in kinds)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def describe(found: list[ForeignImport], shown: int = 3) -> str:
    """The first few, named, and what to do."""
    names = sorted({f.module.split(".")[0] for f in found})
    where = "; ".join(map(str, found[:shown])) + (f"; and {len(found) - shown} more" if len(found) > shown else "")
    return (
        f"{where}: the train_step image has no {', '.join(map(repr, names))} (it has the standard library, "
        "torch, torchvision, numpy, Pillow, safetensors, pyarrow, pydantic and boto3); copy a pure-Python "
        "package into the code folder beside your own (pass the folder that holds both), or leave the import out"
    )
