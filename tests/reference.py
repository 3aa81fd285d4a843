"""Slow, obviously correct numpy versions of the calibration metrics.

Plain Python loops over samples and bins, float64 throughout, no vectorization tricks: the
point is that each line can be checked against the formula by eye. Binning convention as
in the library: bins (b_{m-1}, b_m]; a value at or below b_1 goes to the first bin and a
value above b_{M-1} to the last (so 0 and 1.0 are never dropped).
"""

from __future__ import annotations

import math

import numpy as np


def as_matrix(probs: np.ndarray) -> np.ndarray:
    """(N,) positive-class probabilities -> (N, 2) columns [1 - p, p]; (N, C) unchanged."""
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim == 1:
        return np.stack([1.0 - probs, probs], axis=1)
    return probs


def top_label(probs: np.ndarray, labels: np.ndarray) -> tuple[list[float], list[float]]:
    """Confidence and correctness of the first maximal class of each row."""
    p = as_matrix(probs)
    confidences, correct = [], []
    for i in range(p.shape[0]):
        best = 0
        for k in range(1, p.shape[1]):
            if p[i, k] > p[i, best]:
                best = k
        confidences.append(float(p[i, best]))
        correct.append(1.0 if best == int(labels[i]) else 0.0)
    return confidences, correct


def uniform_edges(n_bins: int) -> list[float]:
    return [m / n_bins for m in range(n_bins + 1)]


def quantile_edges(values: list[float], n_bins: int) -> list[float]:
    """The m/M quantiles, interpolating linearly between order statistics at (n-1) m / M."""
    s = sorted(values)
    n = len(s)
    edges = []
    for m in range(n_bins + 1):
        pos = (n - 1) * (m / n_bins)
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        t = pos - lo
        edges.append(s[lo] + (s[hi] - s[lo]) * t)
    return edges


def bin_of(value: float, edges: list[float]) -> int:
    """First bin m whose upper edge b_{m+1} is >= value; the last bin takes the rest."""
    n_bins = len(edges) - 1
    for m in range(n_bins):
        if m == n_bins - 1 or value <= edges[m + 1]:
            return m
    raise AssertionError("unreachable")


def binned(values: list[float], targets: list[float], edges: list[float]):
    """Per-bin (count, mean value, mean target); means are None for empty bins."""
    n_bins = len(edges) - 1
    members: list[list[int]] = [[] for _ in range(n_bins)]
    for i, v in enumerate(values):
        members[bin_of(v, edges)].append(i)
    out = []
    for idx in members:
        if idx:
            mean_v = sum(values[i] for i in idx) / len(idx)
            mean_t = sum(targets[i] for i in idx) / len(idx)
            out.append((len(idx), mean_v, mean_t))
        else:
            out.append((0, None, None))
    return out


def binned_error(values: list[float], targets: list[float], edges: list[float], norm: str):
    n = len(values)
    bins = [b for b in binned(values, targets, edges) if b[0] > 0]
    if norm == "l1":
        return sum(count / n * abs(t - v) for count, v, t in bins)
    if norm == "l2":
        return math.sqrt(sum(count / n * (t - v) ** 2 for count, v, t in bins))
    if norm == "max":
        return max(abs(t - v) for _, v, t in bins)
    raise ValueError(norm)


def ece(probs, labels, n_bins=15, binning="uniform", norm="l1") -> float:
    conf, correct = top_label(probs, labels)
    edges = uniform_edges(n_bins) if binning == "uniform" else quantile_edges(conf, n_bins)
    return binned_error(conf, correct, edges, norm)


def reliability(probs, labels, n_bins=15, binning="uniform"):
    """(edges, [(count, mean confidence, accuracy), ...]) of the top-label confidences."""
    conf, correct = top_label(probs, labels)
    edges = uniform_edges(n_bins) if binning == "uniform" else quantile_edges(conf, n_bins)
    return edges, binned(conf, correct, edges)


def classwise_ece(probs, labels, n_bins=15, binning="uniform") -> float:
    p = as_matrix(probs)
    total = 0.0
    for k in range(p.shape[1]):
        values = [float(p[i, k]) for i in range(p.shape[0])]
        targets = [1.0 if int(labels[i]) == k else 0.0 for i in range(p.shape[0])]
        if binning == "uniform":
            edges = uniform_edges(n_bins)
        else:
            edges = quantile_edges(values, n_bins)
        total += binned_error(values, targets, edges, "l1")
    return total / p.shape[1]


def ace(probs, labels, n_bins=15) -> float:
    return classwise_ece(probs, labels, n_bins, binning="quantile")


def ace_nixon(probs, labels, n_ranges=15) -> float:
    """Nixon et al. (2019) literally: per class, sort p_{:,k}, cut into R ranges of N/R
    consecutive samples, average |acc(r, k) - conf(r, k)| over all K * R ranges.
    Only meaningful when R divides N."""
    p = as_matrix(probs)
    n, n_classes = p.shape
    size = n // n_ranges
    total = 0.0
    for k in range(n_classes):
        order = sorted(range(n), key=lambda i: p[i, k])
        for r in range(n_ranges):
            idx = order[r * size : (r + 1) * size]
            acc = sum(1.0 for i in idx if int(labels[i]) == k) / size
            conf = sum(float(p[i, k]) for i in idx) / size
            total += abs(acc - conf)
    return total / (n_classes * n_ranges)


def sece(probs, labels, bandwidth=0.05) -> float:
    """O(N^2) loops: a_i = sum_j K_ij r_j / sum_j K_ij (j = i included); mean |a_i - c_i|."""
    conf, correct = top_label(probs, labels)
    n = len(conf)
    total = 0.0
    for i in range(n):
        num = den = 0.0
        for j in range(n):
            k = math.exp(-((conf[i] - conf[j]) ** 2) / (2 * bandwidth**2))
            num += k * correct[j]
            den += k
        total += abs(num / den - conf[i])
    return total / n


def nll(probs, labels, eps=1e-12) -> float:
    p = as_matrix(probs)
    total = 0.0
    for i in range(p.shape[0]):
        total -= math.log(max(float(p[i, int(labels[i])]), eps))
    return total / p.shape[0]


def brier(probs, labels) -> float:
    p = as_matrix(probs)
    total = 0.0
    for i in range(p.shape[0]):
        for k in range(p.shape[1]):
            target = 1.0 if int(labels[i]) == k else 0.0
            total += (float(p[i, k]) - target) ** 2
    return total / p.shape[0]


def error(probs, labels) -> float:
    _, correct = top_label(probs, labels)
    return 1.0 - sum(correct) / len(correct)
