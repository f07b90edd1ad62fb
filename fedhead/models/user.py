"""``model=torch``: the user's own ``torch.nn.Module`` as a fedhead backbone.

``model.module=pkg.mod:Class`` names any module whose ``forward`` maps a batch of inputs to
features ``(N, P)`` through a final ``nn.Linear(width, P)`` (no activation after it): the last
layer's warm start, the finishing step and alignment act on that layer
([`fedhead.models.backbones.Backbone.output_layer`][fedhead.models.Backbone.output_layer]). The class is built as
``Class(**model.kwargs)``, plus ``in_features=F`` (tabular inputs ``(F,)``), ``in_channels=C``
(images ``(C, H, W)``), ``input_shape=...`` and ``feature_dim=P`` for the parameters of those
names its ``__init__`` takes and ``model.kwargs`` does not set. ``model.feature_dim`` is ``P``.

Keyword arguments on the command line: ``+model.kwargs.width=64`` (``kwargs`` is empty in
``conf/model/torch.yaml``, so a new key takes Hydra's ``+``), or
``++model.kwargs={width:64,depth:2}`` (``++``: replace the empty mapping).

The module must be importable wherever clients run: in ``fedhead-run`` on the Ray workers, which
inherit the driver's ``PYTHONPATH`` (``PYTHONPATH=/path/to/your/code fedhead-run ...``) or an
installed package. Every check here (import, class, final layer, output shape on a batch of two)
raises [`UserModelError`][fedhead.models.UserModelError], a configuration error (exit status 2 in ``fedhead-run``): the
import and class at config time, the rest once in the driver before any worker starts
([`check_user_model`][fedhead.models.user.check_user_model]) and again whenever a backbone is built.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from fedhead.analysis.constraints import ConfigError
from fedhead.models.backbones import Backbone, ModelError, map_linear_output, rotate_linear_output
from fedhead.models.config import ModelConfig

__all__ = ["TorchModelConfig", "UserBackbone", "UserModelError", "as_backbone", "check_user_model", "import_class"]

#: Constructor parameters fedhead fills from the data when the class takes them.
_AUTO = ("in_features", "in_channels", "input_shape", "feature_dim")


class UserModelError(ModelError, ConfigError):
    """The user's module cannot serve as a backbone: the message says what it must be."""


def import_class(spec: str) -> type:
    """``"pkg.mod:Class"`` -> the class (an ``nn.Module`` subclass), or
    [`UserModelError`][fedhead.models.UserModelError]."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise UserModelError(f"model.module must be 'package.module:Class', got {spec!r}")
    mod_name, cls_name = spec.split(":")
    try:
        mod = importlib.import_module(mod_name)
    except Exception as exc:
        raise UserModelError(
            f"model.module={spec}: cannot import {mod_name} ({type(exc).__name__}: {exc}); "
            "put its folder on PYTHONPATH or install it"
        ) from exc
    cls = getattr(mod, cls_name, None)
    if cls is None:
        raise UserModelError(f"model.module={spec}: {mod_name} has no attribute {cls_name!r}")
    if not (inspect.isclass(cls) and issubclass(cls, nn.Module)):
        raise UserModelError(f"model.module={spec}: {cls_name} is not a torch.nn.Module subclass")
    return cls


def _final_linear(net: nn.Module, spec: str) -> nn.Linear:
    """The module's last registered submodule if it is an ``nn.Linear`` (in a Sequential: its last
    item), else [`UserModelError`][fedhead.models.UserModelError]."""
    leaves = [m for m in net.modules() if not list(m.children())]
    last = leaves[-1] if leaves else None
    if not isinstance(last, nn.Linear):
        what = "nothing" if last is None else type(last).__name__
        raise UserModelError(
            f"model.module={spec}: the module must end with an nn.Linear producing the features (its "
            f"last registered layer; found {what}): the warm start, finishing step and alignment act on it"
        )
    if last.bias is None:
        raise UserModelError(f"model.module={spec}: its final nn.Linear needs a bias (bias=True)")
    return last


class UserBackbone(Backbone):
    """A user's network wrapped as a [`Backbone`][fedhead.models.Backbone]; its final ``nn.Linear`` is the output
    layer."""

    input_shape: tuple[int, ...]  # always known for a user's network

    def __init__(self, net: nn.Module, input_shape: tuple[int, ...], feature_dim: int, spec: str):
        super().__init__()
        self.net = net
        self.input_shape = tuple(input_shape)
        self.feature_dim = int(feature_dim)
        self.is_image = len(self.input_shape) == 3
        self.spec = spec
        self._out = _final_linear(net, spec)
        if self._out.out_features != self.feature_dim:
            raise UserModelError(
                f"model.module={spec}: its final nn.Linear has {self._out.out_features} outputs but "
                f"model.feature_dim={self.feature_dim}; set model.feature_dim={self._out.out_features}"
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def rotate_features(self, q: np.ndarray | torch.Tensor) -> None:
        rotate_linear_output(self._out, q)

    def map_features(self, m: torch.Tensor, delta: torch.Tensor) -> None:
        map_linear_output(self._out, m, delta)

    def output_layer(self) -> nn.Linear:
        return self._out


@torch.no_grad()
def _check_output(backbone: UserBackbone) -> None:
    """One forward pass on a batch of two (eval mode, no gradient): features must be ``(2, P)``,
    finite, and move with the final layer's bias (nothing after that layer)."""
    spec, p = backbone.spec, backbone.feature_dim
    x = torch.rand(2, *backbone.input_shape)
    was_training = backbone.training
    backbone.eval()
    try:
        out = backbone(x)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, p):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise UserModelError(
                f"model.module={spec}: forward on inputs {tuple(x.shape)} returned {got}, expected features "
                f"(2, {p}) = (batch, model.feature_dim)"
            )
        bias = backbone._out.bias
        bias.add_(1.0)
        moved = backbone(x) - out
        bias.sub_(1.0)
        if not torch.allclose(moved, torch.ones_like(moved), atol=1e-4):
            raise UserModelError(
                f"model.module={spec}: the features are not the outputs of its final nn.Linear (something "
                "follows it in forward); the module must end with that layer"
            )
    except UserModelError:
        raise
    except Exception as exc:
        raise UserModelError(
            f"model.module={spec}: forward on a batch of shape {tuple(x.shape)} failed "
            f"({type(exc).__name__}: {' '.join(str(exc).split())})"
        ) from exc
    finally:
        backbone.train(was_training)


@dataclass(frozen=True)
class TorchModelConfig(ModelConfig):
    """``model=torch``: ``module`` (``pkg.mod:Class``) built with ``kwargs``.

    Attributes
    ----------
    module : str
        ``package.module:Class`` of an ``nn.Module`` ending with ``nn.Linear(width, feature_dim)``.
    kwargs : dict
        Keyword arguments of the class (``+model.kwargs.NAME=VALUE``).
    feature_dim : int
        ``P``, the outputs of the final layer (checked).
    """

    name: str = "torch"
    module: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.kwargs, dict) or not all(isinstance(k, str) for k in self.kwargs):
            raise UserModelError(f"model.kwargs must be a mapping of names to values, got {self.kwargs!r}")
        if not self.module:
            raise UserModelError("model=torch needs model.module=package.module:Class")
        import_class(self.module)

    def build(self, input_shape: tuple[int, ...], n_samples: int) -> Backbone:
        cls = import_class(self.module)
        auto = {
            "in_features": int(np.prod(input_shape)) if len(input_shape) == 1 else None,
            "in_channels": int(input_shape[0]) if len(input_shape) == 3 else None,
            "input_shape": tuple(input_shape),
            "feature_dim": self.feature_dim,
        }
        try:
            params = inspect.signature(cls).parameters
        except (TypeError, ValueError):
            params = {}
        kwargs = dict(self.kwargs)
        for k in _AUTO:
            if k in params and k not in kwargs and auto[k] is not None:
                kwargs[k] = auto[k]
        try:
            net = cls(**kwargs)
        except Exception as exc:
            raise UserModelError(
                f"model.module={self.module}: {cls.__name__}(**{kwargs}) failed ({type(exc).__name__}: {exc})"
            ) from exc
        return as_backbone(net, input_shape, feature_dim=self.feature_dim, name=self.module)


def as_backbone(
    net: nn.Module, input_shape: tuple[int, ...], *, feature_dim: int | None = None, name: str | None = None
) -> UserBackbone:
    """A user's ``nn.Module`` as a fedhead backbone (what [`fedhead.train.train_local`][fedhead.train.train_local] and
    [`fedhead.clients.step.train_step`][fedhead.clients.train_step] train), checked on a batch of two.

    Parameters
    ----------
    net : nn.Module
        Maps inputs ``(N, *input_shape)`` to features ``(N, P)`` through a final ``nn.Linear`` with
        a bias (nothing after it): the warm start, finishing step and alignment act on that layer.
    input_shape : tuple of int
        One sample's shape, e.g. ``(F,)``.
    feature_dim : int, optional
        ``P`` (default: the final layer's outputs); checked when given.
    name : str, optional
        How error messages name the module (default: its class name).

    Raises
    ------
    UserModelError
        No final ``nn.Linear`` with bias, another ``P``, a forward pass that fails or returns
        anything but features ``(2, P)`` that move with the final layer's bias.
    """
    spec = name or type(net).__name__
    p = _final_linear(net, spec).out_features if feature_dim is None else int(feature_dim)
    backbone = UserBackbone(net, input_shape, p, spec)
    _check_output(backbone)
    return backbone


def check_user_model(model: ModelConfig, input_shape: tuple[int, ...], n_samples: int = 2) -> None:
    """Build a [`TorchModelConfig`][fedhead.models.user.TorchModelConfig] backbone once (seed 0) to check it before any
    client starts; other model configs pass."""
    if isinstance(model, TorchModelConfig):
        from fedhead.models.config import build_backbone

        build_backbone(model, input_shape, n_samples, 0)
