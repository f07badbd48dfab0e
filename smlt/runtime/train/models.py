"""Model builders: built-in names or a user's `package.module:build_model`.

The contract, for built-ins and users' builders alike: `build_model(input_shape, output_dim,
**params)` returns a `torch.nn.Module` taking a batch of shape `(rows, *input_shape)`, float32
(or int64 token ids), and giving `(rows, output_dim)`. For token datasets smlt passes the
manifest's `vocab_size` to a builder that takes it, unless the job sets it.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from smlt.runtime.errors import InvalidJob
from smlt.runtime.job import ModelSpec

# Built-in name -> its builder, imported on first use (only a vision model needs torchvision).
# smlt.runtime.job.BUILTIN_MODELS lists the same names for the job's validation (which has no torch).
BUILTINS: dict[str, str] = {
    "mlp": "smlt.runtime.train.tabular:mlp",
    "logreg": "smlt.runtime.train.tabular:logreg",
    "lenet": "smlt.runtime.train.cnn:lenet",
    "resnet18": "smlt.runtime.train.resnet:resnet18",
    "resnet34": "smlt.runtime.train.resnet:resnet34",
    "resnet50": "smlt.runtime.train.resnet:resnet50",
    "transformer": "smlt.runtime.train.transformer:transformer",
}

Builder = Callable[..., nn.Module]


def import_entry_module(name: str) -> Any:
    """The module of a job's entry point (a model builder, a transform). One that imports
    torchvision beside the CPU torch meets PyPI's CUDA-built torchvision, whose import fails
    ("operator torchvision::nms does not exist"; smlt.runtime.train.vision says why): imported
    again after smlt's own torchvision import, which works there."""
    try:
        return importlib.import_module(name)
    except RuntimeError as e:
        if "operator torchvision::nms does not exist" not in str(e):
            raise
    import smlt.runtime.train.vision  # noqa: F401 - makes torchvision importable

    return importlib.import_module(name)


def builder(name: str) -> Builder:
    """The builder a job's model.name means (a built-in or `package.module:function`)."""
    entry = BUILTINS.get(name, name)
    mod_name, _, attr = entry.partition(":")
    try:
        fn = getattr(import_entry_module(mod_name), attr)
    except (ImportError, AttributeError) as e:
        raise InvalidJob(f"model.name: cannot import {name!r} ({e})") from None
    return fn


def _takes(fn: Builder, name: str) -> bool:
    params = inspect.signature(fn).parameters.values()
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _check_params(name: str, fn: Builder, params: dict) -> None:
    """InvalidJob naming the model's parameters when params are not what its builder takes."""
    sig = inspect.signature(fn)
    try:
        sig.bind((1,), 1, **params)
    except TypeError as e:
        takes = [p for p in list(sig.parameters)[2:] if sig.parameters[p].kind is not inspect.Parameter.VAR_KEYWORD]
        raise InvalidJob(
            f"model.params: {name} {e}; it takes {', '.join(takes) if takes else 'no parameters'}"
        ) from None


def build_model(
    spec: ModelSpec, input_shape: Sequence[int], output_dim: int, seed: int, *, vocab_size: int | None = None
) -> nn.Module:
    """Build the model with a deterministic initialisation (same seed → same weights everywhere)."""
    fn = builder(spec.name)
    params = dict(spec.params)
    if vocab_size is not None and _takes(fn, "vocab_size"):
        params.setdefault("vocab_size", vocab_size)
    _check_params(spec.name, fn, params)
    torch.manual_seed(seed)
    try:
        model = fn(tuple(input_shape), output_dim, **params)
    except TypeError as e:
        raise InvalidJob(f"model.params: {e}") from None
    if not isinstance(model, nn.Module):
        raise InvalidJob(f"model.name: {spec.name!r} returned {_what(model)}, not a torch.nn.Module")
    check_shaped(model, spec.name)
    if run_eagerly(model) and spec.name not in _TOLD_EAGER:
        _TOLD_EAGER.add(spec.name)
        from smlt.runtime.progress import notice

        notice.warning(
            f"model.name: {spec.name!r} returns a model compiled with torch.compile (or module.compile()): it trains "
            "uncompiled, the same model (its state keeps its names), as a worker cannot compile it (Lambda's image "
            "has no C++ compiler for torch's inductor, and each worker would compile it again at every cold start); "
            "leave torch.compile out of the builder"
        )
    return model


_TOLD_EAGER: set[str] = set()  # the models whose compilation this process told of (once each)


def run_eagerly(model: nn.Module) -> bool:
    """Undo torch.compile on `model` and its submodules, keeping each wrapper (torch.compile(m)'s
    OptimizedModule, whose state names start `_orig_mod.`) so the state's names stay as built:
    its forward calls the module it holds as it is. True when something was compiled."""
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except ImportError:  # a torch without dynamo compiles nothing
        return False
    found = False
    for m in model.modules():
        if isinstance(m, OptimizedModule):
            m.forward = m._orig_mod.__call__
            found = True
        if getattr(m, "_compiled_call_impl", None) is not None:  # module.compile(), in place
            m._compiled_call_impl = None
            found = True
    return found


def check_shaped(model: nn.Module, name: str) -> None:
    """InvalidJob when the built model holds lazy layers (nn.LazyLinear, nn.LazyConv2d...): their
    weights have no shape until a first forward pass, and the workers store, average and load the
    model as built (model 0 is stored before any forward)."""
    lazy = [k for k, t in [*model.named_parameters(), *model.named_buffers()] if is_lazy(t)]
    if lazy:
        shown = ", ".join(lazy[:4]) + (f" and {len(lazy) - 4} more" if len(lazy) > 4 else "")
        raise InvalidJob(
            f"model.name: {name!r} holds lazy layers whose weights have no shape until a first forward pass "
            f"({shown}): smlt stores and averages the model as the builder returns it; give each layer its input "
            "size (nn.Linear(in_features, out_features) for nn.LazyLinear), or run the model once in the builder "
            "(model(torch.zeros(1, *input_shape))) before returning it"
        )


def _what(got: object) -> str:
    """What a builder returned instead of a module, with the usual slip named."""
    if got is None:
        return "None (a missing return statement?)"
    if isinstance(got, type) and issubclass(got, nn.Module):
        return f"the class {got.__name__} itself (return an instance: {got.__name__}(...))"
    if isinstance(got, (tuple, list)) and any(isinstance(g, nn.Module) for g in got):
        return f"a {type(got).__name__} holding a module (return the module alone)"
    return type(got).__name__


def check_trainable(model: nn.Module, name: str) -> None:
    """InvalidJob when the model has no parameter that training would change (none at all, or
    every one frozen with requires_grad=False)."""
    params = list(model.parameters())
    if any(p.requires_grad for p in params):
        return
    what = (
        "has no parameters"
        if not params
        else f"has {sum(p.numel() for p in params):,} parameters and every one is frozen (requires_grad=False)"
    )
    raise InvalidJob(
        f"model.name: {name!r} {what}, so training would not change it: give it a trainable layer "
        "(or unfreeze one: requires_grad_(True))"
        + (
            "; one created in forward, on its first call, is not there when smlt builds, stores and averages the "
            "model: create it in __init__"
            if not params
            else ""
        )
    )


def state_form(state: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape by name: what form_difference compares."""
    return {k: tuple(v.shape) for k, v in state.items()}


def form_difference(want: dict[str, tuple[int, ...]], got: dict[str, tuple[int, ...]]) -> str:
    """The first difference between two states' names and shapes ("" when they match), named:
    "parameter 'l.weight' of shape (16, 64), not (32, 64)", "no 'w'", "an extra 'w' of shape (64, 10)"."""
    for k, shape in got.items():  # in `got`'s order: a model's own, the first layer first
        if k in want and want[k] != shape:
            return f"{k!r} of shape {shape}, not {want[k]}"
    missing = [k for k in want if k not in got]
    if missing:
        return f"no {missing[0]!r} (of shape {want[missing[0]]})" + (
            f" and {len(missing) - 1} more missing" if len(missing) > 1 else ""
        )
    extra = [k for k in got if k not in want]
    if extra:
        return f"an extra {extra[0]!r} of shape {got[extra[0]]}" + (
            f" and {len(extra) - 1} more" if len(extra) > 1 else ""
        )
    return ""


def reset_torch_defaults() -> list[str]:
    """Set back what a user's code may change for the whole process (a warm Lambda container
    serves later invocations and runs): torch's default dtype (float32) and gradient mode (on).
    What was changed, named ("torch.set_default_dtype(torch.float64)"); [] when nothing was."""
    changed = []
    if torch.get_default_dtype() != torch.float32:
        changed.append(f"torch.set_default_dtype({torch.get_default_dtype()})")
        torch.set_default_dtype(torch.float32)
    if not torch.is_grad_enabled():
        changed.append("torch.set_grad_enabled(False)")
        torch.set_grad_enabled(True)
    return changed
