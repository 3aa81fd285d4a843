r"""Streaming metrics: ``update(probs, labels)`` batch by batch, ``compute()``, ``reset()``.

Each metric keeps the sums its functional twin reduces over the samples, so that
``compute()`` on the batches of an epoch gives the functional metric of the concatenated
batches (up to the order of float64 summation):

* equal-width binned metrics (:class:`StreamingECE` and :class:`StreamingMCE` with
  ``binning="uniform"``, :class:`StreamingClasswiseECE`) keep per-bin sums
  :math:`W_m = \sum_{i \in B_m} w_i`, :math:`\sum_{i \in B_m} w_i c_i` and
  :math:`\sum_{i \in B_m} w_i r_i` (``(M,)``, or ``(C, M)`` classwise): constant memory;
* :class:`StreamingNLL` and :class:`StreamingBrier` keep :math:`\sum_i w_i s_i` and
  :math:`\sum_i w_i`;
* equal-mass bins (``binning="quantile"``) and :class:`StreamingSECE` need every
  confidence (their edges or kernel sums depend on all samples): they keep the top-label
  confidences, correctness and weights, three numbers per sample instead of ``C``.

States merge (:meth:`StreamingMetric.merge`, sums add and per-sample lists concatenate),
and ``compute()`` all-reduces them across processes when ``torch.distributed`` is
initialised. :func:`as_torchmetric` wraps any of them in a ``torchmetrics.Metric`` when
torchmetrics is installed (it is not a requirement).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from calnotes._checks import ArrayLike, check_choice, check_positive_float, check_positive_int
from calnotes.metrics._common import (
    BINNINGS,
    NORMS,
    _bin_index,
    _check_bins,
    _prepare,
    _quantile_edges,
    _scalar,
    _top_label_checked,
    _uniform_edges,
    probs_from_logits,
)
from calnotes.metrics._weights import (
    check_sample_weight,
    weighted_error,
    weighted_quantile_edges,
    weighted_sums,
)
from calnotes.metrics.binned import _weighted_classwise_sums
from calnotes.metrics.smooth import SECE_METHODS, _sece_of

_F64 = torch.float64


class StreamingMetric:
    """Base class: ``sums`` states add up across batches and processes, ``cats`` states
    (per-sample tensors) concatenate. Subclasses define ``_empty_sums``, ``_increment``
    and ``_value``."""

    cat_names: tuple[str, ...] = ()

    def __init__(self, from_logits: bool = False) -> None:
        if not isinstance(from_logits, bool):
            raise TypeError(f"from_logits must be a bool, got {type(from_logits).__name__}")
        self.from_logits = from_logits
        self.reset()

    # -- what subclasses define
    def _empty_sums(self) -> dict[str, torch.Tensor]:  # pragma: no cover
        raise NotImplementedError

    def _increment(self, probs: ArrayLike, labels: ArrayLike, weight: Any
                   ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], torch.dtype, bool]:
        raise NotImplementedError  # pragma: no cover

    def _value(self, sums: dict[str, torch.Tensor], cats: dict[str, torch.Tensor]
               ) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    # -- public API
    def reset(self) -> None:
        """Forget every batch seen so far."""
        self.sums = self._empty_sums()
        self.cats: dict[str, list[torch.Tensor]] = {name: [] for name in self.cat_names}
        self._dtype: torch.dtype | None = None
        self._numpy = False

    def update(self, probs: ArrayLike, labels: ArrayLike,
               sample_weight: ArrayLike | None = None) -> None:
        """Add a batch: ``probs (B, C)`` (logits with ``from_logits=True``), ``labels (B,)``
        and optional ``sample_weight (B,)``."""
        if self.from_logits:
            probs = probs_from_logits(probs)
        sums, cats, dtype, from_numpy = self._increment(probs, labels, sample_weight)
        device = next(iter(sums.values())).device
        for name, value in sums.items():
            self.sums[name] = self.sums[name].to(device) + value
        for name, value in cats.items():
            self.cats[name].append(value.detach())
        if self._dtype is None:
            self._dtype, self._numpy = dtype, from_numpy

    def merge(self, other: StreamingMetric) -> StreamingMetric:
        """Add the state of ``other`` (same class and settings) to this one; returns self."""
        if type(other) is not type(self) or other._settings() != self._settings():
            raise ValueError(f"other must be a {type(self).__name__} with settings "
                             f"{self._settings()}, got {other!r}")
        for name, value in other.sums.items():
            self.sums[name] = self.sums[name] + value.to(self.sums[name].device)
        for name, values in other.cats.items():
            self.cats[name].extend(values)
        if self._dtype is None:
            self._dtype, self._numpy = other._dtype, other._numpy
        return self

    def compute(self, sync: bool | None = None) -> torch.Tensor | float:
        """The metric of every batch seen (by every process when ``sync``; ``None``: when
        ``torch.distributed`` is initialised with more than one process). The state is
        left as it is, so ``update`` may go on."""
        sums = {name: value.clone() for name, value in self.sums.items()}
        cats = {name: torch.cat(values) if values else torch.zeros(0, dtype=_F64)
                for name, values in self.cats.items()}
        if sync is None:
            sync = _distributed()
        if sync:
            for value in sums.values():
                torch.distributed.all_reduce(value)
            cats = {name: _all_gather_cat(value) for name, value in cats.items()}
        if not float(sums["weight"].sum()) > 0:
            raise ValueError(f"{type(self).__name__} has no samples; call update first")
        dtype = self._dtype or _F64
        return _scalar(self._value(sums, cats), dtype, self._numpy)

    def _settings(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items()
                if k not in ("sums", "cats", "cat_names") and not k.startswith("_")}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._settings().items())
        return f"{type(self).__name__}({args})"


def _distributed() -> bool:
    dist = torch.distributed
    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def _all_gather_cat(value: torch.Tensor) -> torch.Tensor:
    """Concatenate the 1-d ``value`` of every process (rank order), whatever their lengths."""
    dist = torch.distributed
    world = dist.get_world_size()
    size = torch.tensor([value.shape[0]], dtype=torch.int64, device=value.device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    longest = int(max(int(s) for s in sizes))
    padded = torch.zeros(longest, dtype=value.dtype, device=value.device)
    padded[: value.shape[0]] = value
    parts = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat([part[: int(s)] for part, s in zip(parts, sizes, strict=True)])


def _check_n_bins(n_bins: Any) -> int:
    """A positive ``n_bins`` of at most ``MAX_BINS`` (1e6), as the
    functional metrics take (the state holds ``3 M`` or ``3 C M`` sums)."""
    n_bins, _ = _check_bins(check_positive_int(n_bins, "n_bins"), "uniform")
    return int(n_bins)


def _weights(sample_weight: Any, n: int, device: torch.device) -> torch.Tensor:
    if sample_weight is None:
        return torch.ones(n, dtype=_F64, device=device)
    return check_sample_weight(sample_weight, n, device)


# --------------------------------------------------------------------------- binned


class StreamingECE(StreamingMetric):
    """Streaming :func:`calnotes.metrics.ece` (same ``n_bins``, ``binning``, ``norm``, and
    ``sample_weight`` in ``update``). Equal-width bins keep ``3 M`` numbers; equal-mass
    bins keep the confidences, as their edges are quantiles of all of them."""

    def __init__(self, n_bins: int = 15, binning: str = "uniform", norm: str = "l1",
                 from_logits: bool = False) -> None:
        self.n_bins = _check_n_bins(n_bins)
        self.binning = check_choice(binning, "binning", BINNINGS)
        self.norm = check_choice(norm, "norm", NORMS)
        self.cat_names = () if self.binning == "uniform" else ("conf", "correct", "w")
        super().__init__(from_logits)

    def _empty_sums(self) -> dict[str, torch.Tensor]:
        m = self.n_bins if self.binning == "uniform" else 1
        return {"weight": torch.zeros(m, dtype=_F64), "sum_v": torch.zeros(m, dtype=_F64),
                "sum_t": torch.zeros(m, dtype=_F64)}

    def _increment(self, probs: ArrayLike, labels: ArrayLike, weight: Any
                   ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], torch.dtype, bool]:
        with torch.no_grad():
            conf, correct, dtype, from_numpy = _top_label_checked(probs, labels)
            w = _weights(weight, conf.shape[0], conf.device)
            if self.binning == "quantile":
                total = w.sum().reshape(1)
                zero = torch.zeros_like(total)
                return ({"weight": total, "sum_v": zero, "sum_t": zero},
                        {"conf": conf.to(_F64), "correct": correct.to(_F64), "w": w},
                        dtype, from_numpy)
            edges = _uniform_edges(self.n_bins, conf.dtype, conf.device)
            idx = _bin_index(conf, edges, uniform=True)
            w_m, sum_v, sum_t = (s[0] for s in weighted_sums(idx, conf, correct, w, self.n_bins))
        return {"weight": w_m, "sum_v": sum_v, "sum_t": sum_t}, {}, dtype, from_numpy

    def _value(self, sums: dict[str, torch.Tensor], cats: dict[str, torch.Tensor]
               ) -> torch.Tensor:
        if self.binning == "uniform":
            return weighted_error(sums["weight"].unsqueeze(0), sums["sum_v"].unsqueeze(0),
                                  sums["sum_t"].unsqueeze(0), self.norm)[0]
        conf, correct, w = cats["conf"], cats["correct"], cats["w"]
        if bool((w == 1).all()):  # the unweighted edges, exactly as ece() computes them
            edges = _quantile_edges(conf.unsqueeze(0), self.n_bins)[0]
        else:
            edges = weighted_quantile_edges(conf.unsqueeze(0), w, self.n_bins)[0]
        # binned in the inputs' dtype, as ece() bins them (an edge between two adjacent
        # float32 confidences rounds onto one of them there, not in float64)
        idx = _bin_index(conf.to(self._dtype or _F64), edges)
        return weighted_error(*weighted_sums(idx, conf, correct, w, self.n_bins), self.norm)[0]


class StreamingMCE(StreamingECE):
    """Streaming :func:`calnotes.metrics.mce`: :class:`StreamingECE` with ``norm="max"``."""

    def __init__(self, n_bins: int = 15, binning: str = "uniform",
                 from_logits: bool = False) -> None:
        super().__init__(n_bins=n_bins, binning=binning, norm="max", from_logits=from_logits)

    def _settings(self) -> dict[str, Any]:
        return {k: v for k, v in super()._settings().items() if k != "norm"}


class StreamingClasswiseECE(StreamingMetric):
    """Streaming :func:`calnotes.metrics.classwise_ece` with equal-width bins: per class and
    bin the sums of ``w_i``, ``w_i p_ik`` and ``w_i 1[y_i = k]`` (``3 C M`` numbers)."""

    def __init__(self, n_classes: int, n_bins: int = 15, from_logits: bool = False) -> None:
        self.n_classes = check_positive_int(n_classes, "n_classes", minimum=2)
        self.n_bins = _check_n_bins(n_bins)
        super().__init__(from_logits)

    def _empty_sums(self) -> dict[str, torch.Tensor]:
        shape = (self.n_classes * self.n_bins,)
        return {"weight": torch.zeros(shape, dtype=_F64), "sum_v": torch.zeros(shape, dtype=_F64),
                "sum_t": torch.zeros(shape, dtype=_F64)}

    def _increment(self, probs: ArrayLike, labels: ArrayLike, weight: Any
                   ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], torch.dtype, bool]:
        with torch.no_grad():
            p, y, from_numpy = _prepare(probs, labels)
            n, c = p.shape
            if c != self.n_classes:
                raise ValueError(f"probs has {c} columns but this metric counts "
                                 f"{self.n_classes} classes")
            w = _weights(weight, n, p.device)
            edges = _uniform_edges(self.n_bins, p.dtype, p.device)
            w_m, sum_v, sum_t = _weighted_classwise_sums(p, y, w, edges, self.n_bins)
        return {"weight": w_m, "sum_v": sum_v, "sum_t": sum_t}, {}, p.dtype, from_numpy

    def _value(self, sums: dict[str, torch.Tensor], cats: dict[str, torch.Tensor]
               ) -> torch.Tensor:
        shape = (self.n_classes, self.n_bins)
        return weighted_error(sums["weight"].view(shape), sums["sum_v"].view(shape),
                              sums["sum_t"].view(shape), "l1").mean()


# --------------------------------------------------------------------------- scores


class _StreamingMean(StreamingMetric):
    """A weighted mean of per-sample scores: ``sum w_i s_i / sum w_i``."""

    def _empty_sums(self) -> dict[str, torch.Tensor]:
        return {"weight": torch.zeros(1, dtype=_F64), "total": torch.zeros(1, dtype=_F64)}

    def _scores(self, p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def _increment(self, probs: ArrayLike, labels: ArrayLike, weight: Any
                   ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], torch.dtype, bool]:
        with torch.no_grad():
            p, y, from_numpy = _prepare(probs, labels)
            w = _weights(weight, p.shape[0], p.device)
            scores = self._scores(p, y).to(_F64)
        return ({"weight": w.sum().reshape(1), "total": (scores * w).sum().reshape(1)}, {},
                p.dtype, from_numpy)

    def _value(self, sums: dict[str, torch.Tensor], cats: dict[str, torch.Tensor]
               ) -> torch.Tensor:
        return (sums["total"] / sums["weight"])[0]


class StreamingNLL(_StreamingMean):
    r"""Streaming :func:`calnotes.metrics.nll`: :math:`-\sum_i w_i \log \max(p_{iy_i},
    \epsilon) / \sum_i w_i`."""

    def __init__(self, eps: float = 1e-12, from_logits: bool = False) -> None:
        self.eps = check_positive_float(eps, "eps")
        if self.eps >= 0.5:
            raise ValueError(f"eps must lie in (0, 0.5), got {self.eps}")
        super().__init__(from_logits)

    def _scores(self, p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return -p.gather(1, y.unsqueeze(1)).squeeze(1).clamp(min=self.eps).to(_F64).log()


class StreamingBrier(_StreamingMean):
    r"""Streaming :func:`calnotes.metrics.brier`: :math:`\sum_i w_i \sum_k (p_{ik} -
    1[y_i = k])^2 / \sum_i w_i`."""

    def _scores(self, p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        onehot = torch.nn.functional.one_hot(y, p.shape[1]).to(p.dtype)
        return (p - onehot).to(_F64).square().sum(dim=1)


# --------------------------------------------------------------------------- SECE


class StreamingSECE(StreamingMetric):
    """Streaming :func:`calnotes.metrics.sece`: keeps each sample's confidence and
    correctness (its kernel sums run over all pairs) and computes SECE on them. No
    ``sample_weight``."""

    cat_names = ("conf", "correct")

    def __init__(self, bandwidth: float = 0.05, method: str = "auto",
                 from_logits: bool = False) -> None:
        self.bandwidth = check_positive_float(bandwidth, "bandwidth")
        self.method = check_choice(method, "method", SECE_METHODS)
        super().__init__(from_logits)

    def _empty_sums(self) -> dict[str, torch.Tensor]:
        return {"weight": torch.zeros(1, dtype=_F64)}

    def _increment(self, probs: ArrayLike, labels: ArrayLike, weight: Any
                   ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], torch.dtype, bool]:
        if weight is not None:
            raise ValueError("sample_weight is not supported by StreamingSECE")
        with torch.no_grad():
            conf, correct, dtype, from_numpy = _top_label_checked(probs, labels)
        n = torch.full((1,), float(conf.shape[0]), dtype=_F64, device=conf.device)
        return {"weight": n}, {"conf": conf.to(_F64), "correct": correct.to(_F64)}, dtype, \
            from_numpy

    def _value(self, sums: dict[str, torch.Tensor], cats: dict[str, torch.Tensor]
               ) -> torch.Tensor:
        # sece() after its top-label step, on the kept confidences
        dtype = self._dtype or _F64
        conf, correct = cats["conf"].to(dtype), cats["correct"].to(dtype)
        value = _sece_of(conf, correct, self.bandwidth, self.method, 1024)
        return torch.as_tensor(value, dtype=_F64)


# --------------------------------------------------------------------------- torchmetrics


def as_torchmetric(metric: StreamingMetric) -> Any:
    """A ``torchmetrics.Metric`` computing ``metric`` (its states synchronise through
    torchmetrics: sums with ``"sum"``, per-sample lists with ``"cat"``). Needs torchmetrics;
    ``ImportError`` when it is absent."""
    if not isinstance(metric, StreamingMetric):
        raise TypeError(f"metric must be a StreamingMetric, got {type(metric).__name__}")
    try:
        from torchmetrics import Metric
    except ImportError as err:
        raise ImportError("as_torchmetric needs torchmetrics (pip install torchmetrics)") from err

    class CalnotesMetric(Metric):
        full_state_update = False

        def __init__(self, inner: StreamingMetric) -> None:
            super().__init__()
            self.inner = copy.deepcopy(inner)
            self.inner.reset()
            for name, value in self.inner.sums.items():
                self.add_state(name, default=value.clone(), dist_reduce_fx="sum")
            for name in self.inner.cat_names:
                self.add_state(name, default=[], dist_reduce_fx="cat")

        def update(self, probs: Any, labels: Any, sample_weight: Any = None) -> None:
            if self.inner.from_logits:
                probs = probs_from_logits(probs)
            sums, cats, dtype, _ = self.inner._increment(probs, labels, sample_weight)
            for name, value in sums.items():
                setattr(self, name, getattr(self, name).to(value.device) + value)
            for name, value in cats.items():
                getattr(self, name).append(value)
            if self.inner._dtype is None:
                self.inner._dtype = dtype

        def compute(self) -> torch.Tensor:
            self.inner.sums = {name: getattr(self, name) for name in self.inner.sums}
            self.inner.cats = {name: _as_list(getattr(self, name))
                               for name in self.inner.cat_names}
            return torch.as_tensor(self.inner.compute(sync=False))

    return CalnotesMetric(metric)


def _as_list(value: Any) -> list[torch.Tensor]:
    """torchmetrics gives a "cat" state back as a list, or as one tensor after a sync."""
    return [value] if isinstance(value, torch.Tensor) else list(value)
