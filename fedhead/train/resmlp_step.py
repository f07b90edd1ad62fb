"""The training step of a ResMLP backbone written out: forward and backward without autograd.

On the CPU at the ``cpu`` scale's shapes (100 rows, width 256) autograd's step spends much of
its time outside the matmuls: PyTorch's PReLU backward is a scalar loop that branches on the sign
of every input (a misprediction in every other element), every step allocates its activations
and gradients afresh (which glibc hands back to the kernel and faults in again), and each graph
node costs the engine a few microseconds. [`ResMLPStep`][fedhead.train.resmlp_step.ResMLPStep]
runs the ATen operations autograd would (the same ``addmm`` and ``mm`` calls on the same memory
layouts, the same reductions for the biases and the PReLU slopes) into buffers it keeps from step
to step, so the gradients are the same bits; PReLU runs as ``leaky_relu`` and
``leaky_relu_backward`` with the slope read as a number, which compute the same
``x > 0 ? x : a x`` and ``x > 0 ? g : a g`` in vectorized kernels
([`fedhead.train.torch_private`][fedhead.train.torch_private]). The gradients are views of one
flat buffer: the gradient clip is screened by one norm of it (the clip's exact norm of per-tensor
norms only when the screen comes within its rounding bound of the threshold).
``benchmarks/bench_step_flops.py`` measures the step against autograd's;
``tests/train/test_train_fast_step.py`` checks gradients and whole training calls against
autograd and ``torch.optim.AdamW``, bit for bit.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import nn

from fedhead.models.backbones import ResidualBlock, ResMLP
from fedhead.train.torch_private import (
    foreach_norm,
    has_global_module_hooks,
    has_hooks,
    leaky_relu,
    leaky_relu_backward,
)

__all__ = ["ResMLPStep"]


#: Where each gradient starts in the flat buffer: a multiple of 16 float32 (64 bytes), the CPU
#: allocator's alignment of a tensor of its own. MKL's small GEMMs can round differently into an
#: output that starts elsewhere (seen on AMD CPUs), which would break the bit-for-bit equality.
_ALIGN = 16


class _Grads:
    """The gradient buffers of the step's parameters: views, in the parameters' order and shapes,
    of one flat buffer, so that the clip's screen is one norm and its rescale one multiply. Each
    view starts ``_ALIGN``-aligned; the gaps between them hold zeros."""

    def __init__(self, params: list[torch.Tensor]):
        self.params = params
        sizes = [p.numel() for p in params]
        starts = list(itertools.accumulate((-(-n // _ALIGN) * _ALIGN for n in sizes), initial=0))
        self.flat = torch.zeros(starts[-1], dtype=torch.float32)
        self.buffers = [self.flat[i : i + n].view(p.shape) for i, n, p in zip(starts, sizes, params, strict=False)]
        self.of = {id(p): g for p, g in zip(params, self.buffers, strict=True)}
        #: a flat norm below this fraction of ``max_norm`` proves the clip inactive (0: never)
        self.screen = max(0.0, 1.0 - _screen_margin(self.flat.numel()))


def _screen_margin(n: int) -> float:
    """How far (relative) below ``max_norm`` a flat norm of ``n`` float32 gradients must be to prove
    the clip inactive: twice the worst-case relative error of a float32 sum of ``n`` positive
    squares, ``n u`` (u = 2^-24), once for the flat norm and once for the norm of norms; at least
    1 % (4.9 % for the cpu scale's 414,471 gradients)."""
    return max(1e-2, 2.0 * n * 2.0**-24)


@dataclass(frozen=True)
class _Linear:
    """A ``Linear`` layer's tensors as the step uses them: ``W``, ``W^T`` (a view), ``b`` and the
    gradient buffers (the bias's as a ``(1, N)`` view, the shape of its row sum)."""

    weight: torch.Tensor
    weight_t: torch.Tensor
    bias: torch.Tensor
    grad_w: torch.Tensor
    grad_b: torch.Tensor

    @classmethod
    def of(cls, layer: nn.Linear, grads: _Grads) -> _Linear:
        w, b = layer.weight, layer.bias
        assert b is not None
        return cls(w, w.t(), b, grads.of[id(w)], grads.of[id(b)].view(1, -1))

    def forward(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``F.linear(x, W, b)``, which is ``addmm(b, x, W^T)`` for a 2-D ``x``."""
        return torch.addmm(self.bias, x, self.weight_t, out=out)

    def backward(self, g: torch.Tensor, x: torch.Tensor, g_in: torch.Tensor | None) -> None:
        """``AddmmBackward0`` of ``addmm(b, x, W^T)``: ``W`` gets ``g^T x`` (``W^T`` is column-major),
        ``b`` the column sums of ``g``; with ``g_in``, the input's ``g W`` (``x`` row-major) into it."""
        torch.mm(g.t(), x, out=self.grad_w)
        torch.sum(g, (0,), keepdim=True, out=self.grad_b)
        if g_in is not None:
            torch.mm(g, self.weight, out=g_in)


@dataclass(frozen=True)
class _PReLU:
    """A one-slope ``PReLU``: the slope and its gradient buffer as a ``(1, 1)`` view."""

    slope: torch.Tensor
    grad: torch.Tensor

    @classmethod
    def of(cls, act: nn.PReLU, grads: _Grads) -> _PReLU:
        return cls(act.weight, grads.of[id(act.weight)].view(1, 1))

    def backward(self, g: torch.Tensor, x: torch.Tensor, a: float, g_x: torch.Tensor, t: torch.Tensor) -> None:
        """``_prelu_kernel_backward`` for the slope ``a``: the input's ``x > 0 ? g : a g`` into ``g_x``,
        and the slope's ``sum(x > 0 ? 0 : x g)``, the ``(B, N)`` products reduced over both dims as
        autograd reduces the broadcast slope (``t``: scratch)."""
        torch.clamp(x, max=0, out=t).mul_(g)
        torch.sum(t, (0, 1), keepdim=True, out=self.grad)
        leaky_relu_backward(g, x, a, g_x)


_vector_norm = torch.linalg.vector_norm


@dataclass
class _Workspace:
    """The activations and gradient buffers of one batch size ``B`` (all ``(B, ·)`` float32)."""

    z0: torch.Tensor  # stem pre-activation
    a0: torch.Tensor  # stem output
    blocks: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]  # u, v, s, out per block
    h: torch.Tensor
    hc: torch.Tensor
    pred: torch.Tensor
    g_pred: torch.Tensor
    g_h: torch.Tensor
    t_h: torch.Tensor
    g: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # three (B, width) gradient buffers
    t: torch.Tensor  # (B, width) scratch of the PReLU slope gradients
    g_loss: torch.Tensor  # d loss / d (sum of squares): 0.5 / B, as autograd's MulBackward0 has it
    g_pen: torch.Tensor  # the same times lambda_H (AddBackward0's alpha)


class ResMLPStep:
    """Forward + backward of [`fedhead.train.steps.forward_loss`][fedhead.train.steps.forward_loss] for a
    [`ResMLP`][fedhead.models.ResMLP] backbone on the CPU, with the gradients written into
    ``.grad`` as ``loss.backward()`` writes them (the same values, bit for bit).

    Build it with [`for_backbone`][fedhead.train.resmlp_step.ResMLPStep.for_backbone], which answers
    None for anything else (another backbone or a subclass, hooks, a PReLU with a slope per
    channel, a frozen or non-float32 parameter, another device): the trainer then runs autograd.
    The gradient buffers live from step to step (each step overwrites them; gradients that were
    there before the first step are added to it, as ``backward()`` would);
    [`release`][fedhead.train.resmlp_step.ResMLPStep.release] sets the ``.grad`` back to None.
    The layers' tensors are read once, at construction: the step's parameters must be changed in
    place only (as the optimiser and the trainer's solves do).
    """

    def __init__(self, backbone: ResMLP, head_weight: torch.Tensor, head_bias: torch.Tensor | None):
        #: every tensor that gets a gradient, in the trainer's order (backbone, head weight, bias)
        self.params = [*backbone.parameters(), head_weight] + ([head_bias] if head_bias is not None else [])
        grad = self._grads = _Grads(self.params)
        self.grads = grad.buffers
        self._stale = {id(p): p.grad for p in self.params if p.grad is not None}
        self._bound = False
        stem, act = backbone.stem[0], backbone.stem[1]
        assert isinstance(stem, nn.Linear) and isinstance(act, nn.PReLU)
        self.stem, self.stem_act = _Linear.of(stem, grad), _PReLU.of(act, grad)
        blocks = [b for b in backbone.blocks if isinstance(b, ResidualBlock)]
        self.blocks = [
            (_Linear.of(b.fc1, grad), _PReLU.of(b.act1, grad), _Linear.of(b.fc2, grad), _PReLU.of(b.act2, grad))
            for b in blocks
        ]
        self.proj = _Linear.of(backbone.proj, grad)
        self._slopes = [self.stem_act.slope] + [t.slope for fc1, act1, fc2, act2 in self.blocks for t in (act1, act2)]
        self.head_weight, self.head_t = head_weight, head_weight.t()
        self.grad_head = grad.of[id(head_weight)]
        self.grad_bias = grad.of[id(head_bias)].view(1, -1) if head_bias is not None else None
        self.width, self.feature_dim = stem.out_features, backbone.proj.out_features
        self._spaces: dict[tuple[int, float], _Workspace] = {}

    @classmethod
    def for_backbone(
        cls, backbone: nn.Module, head_weight: torch.Tensor, head_bias: torch.Tensor | None
    ) -> ResMLPStep | None:
        """The step for ``backbone`` when its forward is exactly ResMLP's on float32 CPU tensors,
        else None. ``head_bias`` is the head's bias when it is trained (None: held fixed)."""
        if type(backbone) is not ResMLP:
            return None
        stem, blocks = backbone.stem, backbone.blocks
        layout = (
            type(stem) is nn.Sequential
            and len(stem) == 2
            and type(stem[0]) is nn.Linear
            and type(stem[1]) is nn.PReLU
            and type(blocks) is nn.Sequential
            and all(
                type(b) is ResidualBlock
                and type(b.fc1) is nn.Linear
                and type(b.fc2) is nn.Linear
                and type(b.act1) is nn.PReLU
                and type(b.act2) is nn.PReLU
                for b in blocks
            )
            and type(backbone.proj) is nn.Linear
        )
        if not layout:
            return None
        modules = list(backbone.modules())
        params = [*backbone.parameters(), head_weight] + ([head_bias] if head_bias is not None else [])
        if (
            has_global_module_hooks()
            or any(has_hooks(m) for m in modules)
            or not all(m.weight.numel() == 1 for m in modules if isinstance(m, nn.PReLU))
            or not all(m.bias is not None for m in modules if isinstance(m, nn.Linear))
            or not all(
                p.requires_grad and p.dtype == torch.float32 and p.device.type == "cpu" and p.is_contiguous()
                for p in params
            )
        ):
            return None
        return cls(backbone, head_weight, head_bias)

    def _space(self, b: int, lambda_h: float) -> _Workspace:
        key = (b, lambda_h)
        ws = self._spaces.get(key)
        if ws is None:
            if len(self._spaces) >= 4:  # a full batch and a short last batch (one lambda_H per call)
                self._spaces.clear()
            w, p, c = self.width, self.feature_dim, self.head_weight.shape[0]

            def new(*shape: int) -> torch.Tensor:
                return torch.empty(shape, dtype=torch.float32)

            # the loss's backward: its gradient 1 times the scalar 0.5 / B (float32), and that
            # times lambda_H for the feature penalty, computed as autograd computes them
            g_loss = torch.ones((), dtype=torch.float32).mul(0.5 / b)
            ws = _Workspace(
                z0=new(b, w),
                a0=new(b, w),
                blocks=[(new(b, w), new(b, w), new(b, w), new(b, w)) for _ in self.blocks],
                h=new(b, p),
                hc=new(b, p),
                pred=new(b, c),
                g_pred=new(b, c),
                g_h=new(b, p),
                t_h=new(b, p),
                g=(new(b, w), new(b, w), new(b, w)),
                t=new(b, w),
                g_loss=g_loss,
                g_pen=g_loss * lambda_h,
            )
            self._spaces[key] = ws
        return ws

    def __call__(
        self,
        bias: torch.Tensor,
        xb: torch.Tensor,
        yb: torch.Tensor,
        lambda_h: float,
        center: torch.Tensor | None,
        batch_center: bool,
    ) -> torch.Tensor:
        """One step's gradients; returns the batch's feature sum ``(P,)`` (a new tensor). The
        arguments are those of ``forward_loss`` without the backbone and the head weight (given
        at construction); ``bias`` is the head bias as the step uses it (detached when fixed)."""
        with torch.no_grad():
            hsum = self._step(bias, xb, yb, lambda_h, center, batch_center)
            if self._stale:
                for p, g in zip(self.params, self.grads, strict=True):
                    old = self._stale.get(id(p))
                    if old is not None:
                        g.add_(old)
                self._stale = {}
        if not self._bound:  # .grad are the buffers from the first step to release()
            for p, g in zip(self.params, self.grads, strict=True):
                p.grad = g
            self._bound = True
        return hsum

    def clip_grad_norm(self, max_norm: float) -> float:
        """[`fedhead.train.steps.clip_gradients`][fedhead.train.steps.clip_gradients] on the CPU
        (``host_check``), with the same results: the rescale of ``clip_grads_with_norm_`` by the
        total norm ``torch.nn.utils.get_total_norm`` computes (the norm of the per-tensor norms, in
        the parameters' order) when the clip is active. Screened by one norm of the flat buffer:
        when that is clearly below ``max_norm`` the clip is inactive and the screen's value is
        returned; else the exact total norm. Call it after the head-only terms are in the head's
        gradient. Non-finite gradients give a non-finite norm either way."""
        with torch.no_grad():
            screen = _vector_norm(self._grads.flat, 2.0).item()
            if screen < self._grads.screen * max_norm - 1e-6:  # False for nan and inf
                return screen
            total = _vector_norm(torch.stack(foreach_norm(self.grads)), 2.0)
            norm = total.item()
            if norm + 1e-6 > max_norm:
                self._grads.flat.mul_(torch.clamp(max_norm / (total + 1e-6), max=1.0))
        return norm

    def release(self) -> None:
        """Set every ``.grad`` back to None (as the autograd loop leaves them)."""
        for p in self.params:
            p.grad = None
        self._bound = False

    def _step(
        self,
        bias: torch.Tensor,
        xb: torch.Tensor,
        yb: torch.Tensor,
        lambda_h: float,
        center: torch.Tensor | None,
        batch_center: bool,
    ) -> torch.Tensor:
        ws = self._space(xb.shape[0], lambda_h)
        # forward, keeping every layer's input: F.linear is addmm(b, x, W^T), a one-slope PReLU
        # is leaky_relu with that slope, and a block's sum a + fc2(.) is added in place
        a0, *values = torch.cat(self._slopes).tolist()  # the slopes as numbers, read at once
        slopes = list(zip(values[::2], values[1::2], strict=True))
        leaky_relu(self.stem.forward(xb, ws.z0), a0, out=ws.a0)
        a = ws.a0
        for (fc1, _, fc2, _), (u, v, s, out), (a1, a2) in zip(self.blocks, ws.blocks, slopes, strict=True):
            leaky_relu(fc1.forward(a, u), a1, out=v)
            fc2.forward(v, s).add_(a)
            leaky_relu(s, a2, out=out)
            a = out
        h = self.proj.forward(a, ws.h)
        hsum = h.sum(0)
        if batch_center:
            center = hsum / h.shape[0]
        hc = h if center is None else torch.sub(h, center, out=ws.hc)
        torch.addmm(bias, hc, self.head_t, out=ws.pred)

        # backward of minibatch_loss, (||pred - y||^2 + lambda_H ||h||^2) 0.5 / B: each square's
        # gradient is grad * (2 x) (PowBackward0), the two paths into h added
        g_pred = torch.sub(ws.pred, yb, out=ws.g_pred).mul_(2.0).mul_(ws.g_loss)
        if self.grad_bias is not None:
            torch.sum(g_pred, (0,), keepdim=True, out=self.grad_bias)
        torch.mm(g_pred.t(), hc, out=self.grad_head)
        g_h = torch.mm(g_pred, self.head_weight, out=ws.g_h)
        g_h.add_(torch.mul(h, 2.0, out=ws.t_h).mul_(ws.g_pen))

        g_a, g_b, g_c = ws.g
        self.proj.backward(g_h, a, g_a)
        for i in reversed(range(len(self.blocks))):
            (fc1, act1, fc2, act2), (u, v, s, _), (a1, a2) = self.blocks[i], ws.blocks[i], slopes[i]
            a_in = ws.blocks[i - 1][3] if i > 0 else ws.a0  # the block's input
            act2.backward(g_a, s, a2, g_b, ws.t)  # d/ds in b
            fc2.backward(g_b, v, g_a)  # d/dv in a
            act1.backward(g_a, u, a1, g_c, ws.t)  # d/du in c
            fc1.backward(g_c, a_in, g_a)  # d/d(input) through fc1 in a,
            g_a.add_(g_b)  # plus the residual path's
        self.stem_act.backward(g_a, ws.z0, a0, g_b, ws.t)
        self.stem.backward(g_b, xb, None)
        return hsum
