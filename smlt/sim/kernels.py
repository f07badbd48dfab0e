"""scikit-learn's Gaussian-process kernels as the SMLT-style baseline uses them, with what they
look up about themselves remembered.

sklearn's kernels rediscover their hyperparameters (`dir()` of the kernel) and their parameters
(the constructor's signature) on every read and write of `theta`, and an operator (`Sum`,
`Product`) reads the whole `theta` of its left side to learn its size before each write. A GP fit
here (L-BFGS-B: ~20 evaluations of the marginal likelihood, each writing `theta` through two
levels of operators) spent most of its time so. These classes remember the names per class and
each kernel's size; what they compute is sklearn's, so a fit gives the same numbers.
"""

from __future__ import annotations

from inspect import Parameter, signature

from sklearn.gaussian_process import kernels as sk

_HYPERPARAMETERS: dict[type, list[str]] = {}
_PARAMS: dict[type, list[str]] = {}


class _Remembered:
    """A kernel's hyperparameter and parameter names, looked up once per class (sklearn's
    `Kernel.hyperparameters` and `Kernel.get_params` find the same ones on every call)."""

    @property
    def hyperparameters(self):
        names = _HYPERPARAMETERS.get(type(self))
        if names is None:
            names = _HYPERPARAMETERS[type(self)] = [a for a in dir(self) if a.startswith("hyperparameter_")]
        return [getattr(self, a) for a in names]

    def get_params(self, deep=True):
        names = _PARAMS.get(type(self))
        if names is None:
            found = signature(type(self).__init__).parameters.values()
            names = _PARAMS[type(self)] = [
                p.name for p in found if p.kind != Parameter.VAR_KEYWORD and p.name != "self"
            ]
        return {a: getattr(self, a) for a in names}


class _Sized:
    """A kernel's number of free hyperparameters, counted once (it changes only with which are
    fixed, which nothing here changes after construction); `+` and `*` make the classes here."""

    @property
    def n_dims(self):
        n = self.__dict__.get("_n_dims")
        if n is None:
            n = self.__dict__["_n_dims"] = self.theta.shape[0]  # type: ignore[attr-defined]  # a Kernel's
        return n

    def __add__(self, b):
        return Sum(self, b if isinstance(b, sk.Kernel) else ConstantKernel(b))

    def __mul__(self, b):
        return Product(self, b if isinstance(b, sk.Kernel) else ConstantKernel(b))


class ConstantKernel(_Sized, _Remembered, sk.ConstantKernel):
    pass


class RBF(_Sized, _Remembered, sk.RBF):
    pass


class DotProduct(_Sized, _Remembered, sk.DotProduct):
    pass


class WhiteKernel(_Sized, _Remembered, sk.WhiteKernel):
    pass


class Sum(_Sized, sk.Sum):
    pass


class Product(_Sized, sk.Product):
    pass
