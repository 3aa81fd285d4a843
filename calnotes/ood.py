"""Out-of-distribution (OOD) detection: scores, detection metrics and OOD image sources.

Convention, used by every function here: **in-distribution (ID) is the positive class and a
higher score means "more in-distribution"**. A detector keeps a sample as ID when its score
is ``>= threshold``.

Scores take ``logits (N, C)`` and return ``(N,)`` of the same kind (torch on the same
device, or numpy): :func:`msp`, :func:`max_logit`, :func:`energy`; :func:`odin` and
:func:`odin_scores` need the model because they perturb the input.

Metrics take ``scores_in`` and ``scores_out`` (1-d, finite, non-empty) and return floats:
:func:`auroc`, :func:`aupr_in`, :func:`aupr_out`, :func:`fpr_at_tpr`; :func:`ood_report`
tabulates them for several OOD sets.

OOD images as data: :func:`gaussian_noise_images`, :func:`uniform_noise_images` and
:func:`load_image_folder` return ``uint8`` tensors ``(N, C, H, W)``
(:func:`calnotes.data.ood_images` picks one by name, shaped like a dataset).

A trained run on OOD sets: :func:`run_ood_logits` gives a stored run's logits on OOD
images (cached next to the run, so the book needs no weights), :func:`trained_model`
recovers the run's model from its checkpoint, and :func:`score_report` tabulates the
detection metrics of a named score.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from scipy.stats import rankdata
from torch import nn

from calnotes._checks import (
    ArrayLike,
    as_tensor,
    check_logits,
    check_positive_float,
    check_positive_int,
    like_input,
)
from calnotes.training import _model_device

__all__ = [
    "IMAGE_SUFFIXES",
    "OOD_LOGITS_FILE",
    "SCORES",
    "aupr_in",
    "aupr_out",
    "auroc",
    "energy",
    "fpr_at_tpr",
    "gaussian_noise_images",
    "load_image_folder",
    "max_logit",
    "msp",
    "odin",
    "odin_scores",
    "ood_report",
    "run_ood_logits",
    "score_report",
    "trained_model",
    "uniform_noise_images",
]

# ---------------------------------------------------------------------------------------
# scores from logits
# ---------------------------------------------------------------------------------------


def msp(logits: ArrayLike) -> ArrayLike:
    r"""Maximum softmax probability :math:`\max_c \operatorname{softmax}(z)_c` (Hendrycks &
    Gimpel 2017)."""
    z, numpy_out = check_logits(logits)
    return like_input(F.softmax(z, dim=1).amax(dim=1), numpy_out)


def max_logit(logits: ArrayLike) -> ArrayLike:
    r"""Maximum logit :math:`\max_c z_c` (Hendrycks et al. 2022)."""
    z, numpy_out = check_logits(logits)
    return like_input(z.amax(dim=1), numpy_out)


def energy(logits: ArrayLike, temperature: float = 1.0) -> ArrayLike:
    r"""Negative free energy :math:`T \log \sum_c e^{z_c / T}` (Liu et al. 2020); higher =
    more ID."""
    temperature = check_positive_float(temperature, "temperature")
    z, numpy_out = check_logits(logits)
    return like_input(temperature * torch.logsumexp(z / temperature, dim=1), numpy_out)


# ---------------------------------------------------------------------------------------
# ODIN
# ---------------------------------------------------------------------------------------


def _check_epsilon(epsilon: Any) -> float:
    if isinstance(epsilon, bool) or not isinstance(
        epsilon, (int, float, np.floating, np.integer)
    ):
        raise TypeError(f"epsilon must be a number, got {type(epsilon).__name__}")
    epsilon = float(epsilon)
    if not math.isfinite(epsilon) or epsilon < 0:
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon}")
    return epsilon


def _odin_batch(
    model: nn.Module, x: torch.Tensor, temperature: float, epsilon: float
) -> torch.Tensor:
    """ODIN scores of one batch (inputs already validated)."""
    if epsilon > 0:
        x_in = x.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            log_msp = F.log_softmax(model(x_in) / temperature, dim=1).amax(dim=1)
            (grad,) = torch.autograd.grad(-log_msp.sum(), x_in)
        # x~ = x - eps * sign(-grad_x log S_max): a step that raises the max softmax.
        x_tilde = x.detach() - epsilon * torch.sign(grad)
    else:
        x_tilde = x.detach()
    with torch.no_grad():
        return F.softmax(model(x_tilde) / temperature, dim=1).amax(dim=1)


def odin(
    model: nn.Module,
    x: ArrayLike,
    temperature: float = 1000.0,
    epsilon: float = 0.0014,
) -> ArrayLike:
    """ODIN score (Liang et al. 2018) of a batch ``x``; higher = more ID.

    ``x~ = x - epsilon * sign(-grad_x log max_c softmax(f(x) / T)_c)`` and the score is
    ``max_c softmax(f(x~) / T)_c``. ``epsilon`` is in the units of the model's input (the
    paper's value assumes inputs in [0, 1] before normalisation). With ``epsilon = 0`` the
    score is the temperature-scaled MSP. Call ``model.eval()`` first: this function leaves
    the model's mode and parameter gradients untouched. ``x`` must already be on the model's
    device; the result is on that device (numpy in, numpy out).
    """
    if not isinstance(model, nn.Module) and not callable(model):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    temperature = check_positive_float(temperature, "temperature")
    epsilon = _check_epsilon(epsilon)
    xt, numpy_out = as_tensor(x, "x")
    if not torch.is_floating_point(xt):
        raise TypeError(f"x must have a floating-point dtype, got {xt.dtype}")
    if xt.ndim < 2 or xt.shape[0] == 0:
        raise ValueError(f"x must be a non-empty batch (N, ...), got shape {tuple(xt.shape)}")
    return like_input(_odin_batch(model, xt, temperature, epsilon), numpy_out)


def odin_scores(
    model: nn.Module,
    loader: Iterable[Any],
    temperature: float = 1000.0,
    epsilon: float = 0.0014,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """ODIN scores (see :func:`odin`) over every batch of ``loader``, as one CPU tensor (N,).

    A batch is either the inputs or a tuple/list whose first item is the inputs (labels are
    ignored). Batches are moved to ``device`` (default: the model's device).
    """
    temperature = check_positive_float(temperature, "temperature")
    epsilon = _check_epsilon(epsilon)
    target = torch.device(device) if device is not None else _model_device(model)
    scores = []
    for batch in loader:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        xt, _ = as_tensor(x, "batch inputs")
        batch_scores = odin(model, xt.to(target), temperature, epsilon)
        assert isinstance(batch_scores, torch.Tensor)  # a tensor in gives a tensor out
        scores.append(batch_scores.cpu())
    if not scores:
        raise ValueError("loader yielded no batches")
    return torch.cat(scores)


# ---------------------------------------------------------------------------------------
# detection metrics
# ---------------------------------------------------------------------------------------


def _scores(x: Any, name: str) -> np.ndarray:
    """Validate 1-d, non-empty, finite, real scores; return them as float64 numpy."""
    t, _ = as_tensor(x, name)
    if t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"{name} must be real numbers, got dtype {t.dtype}")
    if t.ndim != 1:
        raise ValueError(f"{name} must have shape (N,), got shape {tuple(t.shape)}")
    if t.shape[0] == 0:
        raise ValueError(f"{name} is empty")
    a = t.detach().cpu().to(torch.float64).numpy()
    if not np.isfinite(a).all():
        raise ValueError(f"{name} contains NaN or inf")
    return a


def _check_tpr(tpr: Any) -> float:
    if isinstance(tpr, bool) or not isinstance(tpr, (int, float, np.floating, np.integer)):
        raise TypeError(f"tpr must be a number, got {type(tpr).__name__}")
    tpr = float(tpr)
    if not 0.0 < tpr < 1.0:
        raise ValueError(f"tpr must lie in the open interval (0, 1), got {tpr}")
    return tpr


def auroc(scores_in: ArrayLike, scores_out: ArrayLike) -> float:
    """Area under the ROC curve with ID as positive.

    ``AUROC = P(s_in > s_out) + 0.5 P(s_in = s_out)`` over all ID/OOD pairs, computed from
    average ranks (Mann-Whitney U); ties count one half.
    """
    s_in = _scores(scores_in, "scores_in")
    s_out = _scores(scores_out, "scores_out")
    ranks = rankdata(np.concatenate([s_in, s_out]))  # average ranks for ties
    n_in, n_out = len(s_in), len(s_out)
    u = ranks[:n_in].sum() - n_in * (n_in + 1) / 2.0
    return float(u / (n_in * n_out))


def _average_precision(pos: np.ndarray, neg: np.ndarray) -> float:
    """``AP = sum_k (R_k - R_{k-1}) P_k`` over distinct thresholds, highest first."""
    scores = np.concatenate([pos, neg])
    is_pos = np.concatenate([np.ones(len(pos)), np.zeros(len(neg))])
    order = np.argsort(-scores, kind="stable")
    scores, is_pos = scores[order], is_pos[order]
    # last index of each run of equal scores: a threshold admits a whole tie group at once
    ends = np.flatnonzero(np.append(np.diff(scores) != 0, True))
    tp = np.cumsum(is_pos)[ends]
    predicted = ends + 1.0
    precision = tp / predicted
    recall = tp / len(pos)
    return float(np.sum(np.diff(np.concatenate([[0.0], recall])) * precision))


def aupr_in(scores_in: ArrayLike, scores_out: ArrayLike) -> float:
    """Area under the precision-recall curve with ID as positive (step-wise average precision).

    ``AP = sum_k (R_k - R_{k-1}) P_k`` with ``P_k, R_k`` at the k-th distinct threshold
    (highest first); tied scores enter together. This is sklearn's ``average_precision_score``.
    """
    return _average_precision(_scores(scores_in, "scores_in"), _scores(scores_out, "scores_out"))


def aupr_out(scores_in: ArrayLike, scores_out: ArrayLike) -> float:
    """Average precision with OOD as positive, ranking by the negated scores."""
    s_in = _scores(scores_in, "scores_in")
    s_out = _scores(scores_out, "scores_out")
    return _average_precision(-s_out, -s_in)


def fpr_at_tpr(scores_in: ArrayLike, scores_out: ArrayLike, tpr: float = 0.95) -> float:
    """False-positive rate at the threshold that keeps at least ``tpr`` of the ID samples.

    Threshold rule: with ``n`` ID scores sorted in decreasing order ``s_(1) >= ... >= s_(n)``
    and ``k = ceil(tpr * n)`` (``tpr * n`` is rounded to 9 decimals first, so ``0.7 * 10``
    counts as 7), the threshold is ``t = s_(k)``: the largest ``t`` with
    ``#{s_in >= t} >= tpr * n``. Ties: every ID score equal to ``t`` is kept (the TPR
    actually reached may exceed ``tpr``) and every OOD score equal to ``t`` is a false
    positive, i.e. ``FPR = #{s_out >= t} / n_out``. This equals reading sklearn's
    ``roc_curve`` (all thresholds) at the first point with ``TPR >= tpr``.
    """
    tpr = _check_tpr(tpr)
    s_in = _scores(scores_in, "scores_in")
    s_out = _scores(scores_out, "scores_out")
    k = max(1, math.ceil(round(tpr * len(s_in), 9)))
    threshold = np.sort(s_in)[::-1][k - 1]
    return float(np.mean(s_out >= threshold))


def ood_report(
    scores_in: ArrayLike, scores_out: Mapping[str, ArrayLike], tpr: float = 0.95
) -> pd.DataFrame:
    """One row per OOD set plus ``"average"`` (the mean of the rows) with the four metrics.

    Columns: ``auroc``, ``aupr_in``, ``aupr_out`` and ``fpr@{100 tpr}tpr`` (e.g. ``fpr@95tpr``).
    """
    tpr = _check_tpr(tpr)
    if not isinstance(scores_out, Mapping):
        raise TypeError(
            f"scores_out must be a mapping name -> scores, got {type(scores_out).__name__}"
        )
    if len(scores_out) == 0:
        raise ValueError("scores_out is empty: give at least one OOD set")
    if "average" in scores_out:
        raise ValueError("scores_out may not contain an OOD set named 'average'")
    s_in = _scores(scores_in, "scores_in")
    fpr_col = f"fpr@{100 * tpr:g}tpr"
    rows = {}
    for name, out in scores_out.items():
        s_out = _scores(out, f"scores_out[{name!r}]")
        rows[str(name)] = {
            "auroc": auroc(s_in, s_out),
            "aupr_in": aupr_in(s_in, s_out),
            "aupr_out": aupr_out(s_in, s_out),
            fpr_col: fpr_at_tpr(s_in, s_out, tpr),
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.loc["average"] = table.mean(axis=0)
    table.index.name = "ood_set"
    return table


# ---------------------------------------------------------------------------------------
# OOD images as data
# ---------------------------------------------------------------------------------------

#: File suffixes :func:`load_image_folder` reads (case-insensitive).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def _check_image_shape(shape: Any) -> tuple[int, int, int]:
    if not isinstance(shape, (tuple, list)) or len(shape) != 3:
        raise ValueError(f"shape must be (C, H, W), got {shape!r}")
    c, h, w = (check_positive_int(v, f"shape[{i}]") for i, v in enumerate(shape))
    return c, h, w


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return int(seed)


def gaussian_noise_images(n: int, shape: tuple[int, int, int], seed: int = 0) -> torch.Tensor:
    """``n`` Gaussian-noise images, uint8 ``(n, C, H, W)`` on the CPU.

    Pixels are ``clip(round(128 + 64 z), 0, 255)`` with ``z ~ N(0, 1)`` i.i.d., drawn from a
    generator seeded with ``seed``.
    """
    n = check_positive_int(n, "n")
    c, h, w = _check_image_shape(shape)
    gen = torch.Generator().manual_seed(_check_seed(seed))
    z = torch.randn((n, c, h, w), generator=gen, dtype=torch.float32)
    return (128.0 + 64.0 * z).round().clamp(0, 255).to(torch.uint8)


def uniform_noise_images(n: int, shape: tuple[int, int, int], seed: int = 0) -> torch.Tensor:
    """``n`` uniform-noise images, uint8 ``(n, C, H, W)``: pixels i.i.d. uniform on {0..255}."""
    n = check_positive_int(n, "n")
    c, h, w = _check_image_shape(shape)
    gen = torch.Generator().manual_seed(_check_seed(seed))
    return torch.randint(0, 256, (n, c, h, w), generator=gen, dtype=torch.uint8)


def load_image_folder(
    path: str | Path, size: int | tuple[int, int], channels: int = 3
) -> torch.Tensor:
    """Read every PNG/JPEG in ``path`` (sorted by name) into uint8 ``(N, channels, H, W)``.

    Images are converted to grayscale (``channels=1``) or RGB (``channels=3``) and resized to
    ``size`` (``int`` for square, or ``(H, W)``) with bilinear filtering. Raises
    ``FileNotFoundError`` if ``path`` is not a folder and ``ValueError`` if it holds no image.
    """
    from PIL import Image

    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"path is not a folder: {str(folder)!r}")
    if isinstance(size, (tuple, list)):
        if len(size) != 2:
            raise ValueError(f"size must be an int or (H, W), got {size!r}")
        height, width = (check_positive_int(v, "size") for v in size)
    else:
        height = width = check_positive_int(size, "size")
    channels = check_positive_int(channels, "channels")
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    files = sorted(
        p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
    )
    if not files:
        raise ValueError(
            f"path {str(folder)!r} contains no image files with suffix {IMAGE_SUFFIXES}"
        )
    mode = "L" if channels == 1 else "RGB"
    images = []
    for file in files:
        with Image.open(file) as img:
            resized = img.convert(mode).resize((width, height), Image.Resampling.BILINEAR)
            arr = np.asarray(resized, dtype=np.uint8)
        images.append(arr[None] if channels == 1 else arr.transpose(2, 0, 1))
    return torch.from_numpy(np.stack(images))


# ---------------------------------------------------------------------------------------
# a trained run on OOD sets
# ---------------------------------------------------------------------------------------

#: Scores :func:`score_report` knows by name (each maps logits to "higher = more ID").
SCORES = {"msp": msp, "max_logit": max_logit, "energy": energy}

#: File, inside a stored run's folder, that caches the run's logits on OOD image sets.
OOD_LOGITS_FILE = "ood_logits.npz"


def score_report(
    logits_in: ArrayLike,
    logits_out: Mapping[str, ArrayLike],
    score: str = "msp",
    tpr: float = 0.95,
) -> pd.DataFrame:
    """:func:`ood_report` of the score ``score`` (a name of :data:`SCORES`).

    The score is computed in float64 from the in-distribution logits ``(N, C)`` and from
    each OOD set's logits, so float32 rounding (an MSP of exactly 1.0) creates no ties.
    """
    if not isinstance(score, str) or score not in SCORES:
        raise ValueError(f"score must be one of {sorted(SCORES)}, got {score!r}")
    if not isinstance(logits_out, Mapping):
        raise TypeError(
            f"logits_out must be a mapping name -> logits, got {type(logits_out).__name__}"
        )
    fn = SCORES[score]

    def scores(z: ArrayLike, name: str) -> ArrayLike:
        t, _ = as_tensor(z, name)
        if not torch.is_floating_point(t):
            raise TypeError(f"{name} must have a floating-point dtype, got {t.dtype}")
        return fn(t.detach().cpu().double())

    return ood_report(
        scores(logits_in, "logits_in"),
        {k: scores(v, f"logits_out[{k!r}]") for k, v in logits_out.items()},
        tpr=tpr,
    )


def _images_digest(images: torch.Tensor) -> str:
    import hashlib

    array = images.detach().cpu().contiguous().numpy()
    digest = hashlib.sha256(str(tuple(array.shape)).encode())
    digest.update(array.tobytes())
    return digest.hexdigest()


def _run_stamp(run: Any) -> str:
    """Identifies one training of a stored run: a retrained run gets a new stamp."""
    p = run.provenance
    return f"{p.get('config_hash')}@{p.get('date_utc')}"


def _checkpoint_roots(run: Any, checkpoint_root: str | Path | None) -> list[Path]:
    if checkpoint_root is not None:
        return [Path(checkpoint_root)]
    from calnotes.store import default_checkpoint_root

    # calnotes.notebook.chapter_run keeps the checkpoints of a scratch (SMOKE) store in a
    # "checkpoints" folder next to the store root: look there first
    return [Path(run.path).parents[2] / "checkpoints", default_checkpoint_root()]


def _reproduces(model: nn.Module, run: Any, test_loader: Any) -> bool:
    from calnotes import training

    logits, _ = training.predict_logits(model, test_loader)
    return logits.shape == run.test_logits.shape and torch.allclose(
        logits, run.test_logits, rtol=2e-3, atol=2e-3
    )


def trained_model(
    run: Any,
    *,
    device: str | torch.device = "auto",
    checkpoint_root: str | Path | None = None,
    retrain: bool = True,
) -> tuple[nn.Module, Any]:
    """The trained model of a stored run and its dataset splits: ``(model, splits)``.

    The store keeps logits, not weights. The weights come from the run's final training
    checkpoint ``<root>/<config hash>/last.pt``, looked for in ``checkpoint_root`` (default:
    the ``checkpoints`` folder next to the store root, then
    :func:`calnotes.store.default_checkpoint_root`). A checkpoint is used only if its model
    reproduces the stored test logits (to float16 storage precision): one left by another
    training of the same config is skipped. Without a usable checkpoint, ``retrain=True``
    trains the run again in a temporary folder (deterministic on the CPU) and checks the
    result the same way; ``RuntimeError`` if that fails too, ``FileNotFoundError`` if
    ``retrain=False`` and no checkpoint exists. The model is returned in eval mode on
    ``device``.
    """
    import tempfile

    from calnotes import data, experiments, models, store, training

    if not isinstance(run, store.StoredRun):
        raise TypeError(f"run must be a calnotes.store.StoredRun, got {type(run).__name__}")
    if not isinstance(retrain, bool):
        raise TypeError(f"retrain must be a bool, got {type(retrain).__name__}")
    cfg = experiments.default_config(**run.config)
    digest = store.config_hash(cfg)
    dev = training.select_device(device)
    splits = data.load_dataset(
        cfg["dataset"], val_size=cfg["val_size"], seed=cfg["seed"],
        train_subset=cfg["train_subset"], test_subset=cfg["test_subset"],
    )
    if cfg.get("positive_class") is not None:  # a binary run, as train_run builds it
        splits = data.binary_target(splits, cfg["positive_class"])
    _, _, test_loader = data.make_loaders(splits, batch_size=1000, device=dev)
    roots = _checkpoint_roots(run, checkpoint_root)
    tried = []
    for path in (r / digest / "last.pt" for r in roots):
        if not path.is_file():
            continue
        state = torch.load(path, map_location="cpu", weights_only=True)
        if int(state.get("epoch", -1)) != cfg["epochs"]:
            tried.append(f"{path} (unfinished)")
            continue
        model: nn.Module = models.build_model(
            cfg["model"], splits.num_classes, splits.in_channels, splits.image_size,
            **cfg["model_options"],
        )
        model.load_state_dict(state["model"])
        model = model.to(dev).eval()
        if _reproduces(model, run, test_loader):
            return model, splits
        tried.append(f"{path} (another training: its test logits differ)")
    if not retrain:
        if not tried:
            raise FileNotFoundError(
                f"no checkpoint of run {digest} in {[str(r) for r in roots]}; pass "
                "retrain=True to train it again"
            )
        raise RuntimeError(f"no checkpoint reproduces stored run {digest}: {'; '.join(tried)}")
    with tempfile.TemporaryDirectory(prefix="calnotes-retrain-") as tmp:
        result = experiments.train_run(cfg, device=dev, checkpoint_dir=tmp, progress=False)
    if result.model is None:  # train_run always returns the model; keep mypy informed
        raise RuntimeError("train_run returned no model")
    model = result.model.to(dev).eval()
    if not _reproduces(model, run, test_loader):
        raise RuntimeError(
            f"a retrained model does not reproduce the stored test logits of run {digest} "
            f"({run.path}), e.g. because training is not deterministic on {dev}; tried "
            f"{tried or 'no checkpoint'}. Delete the stored run to train it again."
        )
    return model, splits


def run_ood_logits(
    run: Any,
    images: Mapping[str, torch.Tensor],
    *,
    device: str | torch.device = "auto",
    checkpoint_root: str | Path | None = None,
    batch_size: int = 1000,
) -> dict[str, torch.Tensor]:
    """Logits of a stored run's model on each OOD image set, cached in the run's folder.

    ``images`` maps a set's name to uint8 images ``(N, C, H, W)`` shaped like the run's
    dataset (see :func:`calnotes.data.ood_images`); they are normalized with the run's
    training mean and std, as the in-distribution images were. The logits are kept in
    :data:`OOD_LOGITS_FILE` next to the run (float16, like the store's), keyed by the
    set's name and the SHA-256 of its images, and valid only for this training of the run
    (a retrained run recomputes them). Sets not in the cache need the trained model
    (:func:`trained_model`). Returns ``{name: float32 logits (N, C)}`` on the CPU.
    """
    from calnotes import data, store, training

    if not isinstance(run, store.StoredRun):
        raise TypeError(f"run must be a calnotes.store.StoredRun, got {type(run).__name__}")
    if not isinstance(images, Mapping) or not images:
        raise ValueError("images must be a non-empty mapping name -> uint8 images")
    batch_size = check_positive_int(batch_size, "batch_size")
    digests = {}
    for name, x in images.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"image set names must be non-empty str, got {name!r}")
        if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8 or x.ndim != 4:
            raise ValueError(f"images[{name!r}] must be a uint8 tensor (N, C, H, W)")
        if x.shape[0] == 0:
            raise ValueError(f"images[{name!r}] is empty")
        digests[name] = _images_digest(x)

    path = Path(run.path) / OOD_LOGITS_FILE
    stamp = _run_stamp(run)
    cache: dict[str, tuple[str, np.ndarray]] = {}
    if path.is_file():
        with np.load(path) as npz:
            if str(npz["stamp"]) == stamp:
                for i, name in enumerate(npz["names"].tolist()):
                    cache[name] = (str(npz[f"sha256_{i}"]), npz[f"logits_{i}"])
    missing = [k for k in images if k not in cache or cache[k][0] != digests[k]]
    if missing:
        model, splits = trained_model(run, device=device, checkpoint_root=checkpoint_root)
        dev = next(iter(model.parameters())).device
        for name in missing:
            x = images[name]
            loader = data.DeviceLoader(
                data.ImageData(x, torch.zeros(x.shape[0], dtype=torch.long)), batch_size,
                shuffle=False, mean=splits.mean, std=splits.std, device=dev,
            )
            logits, _ = training.predict_logits(model, loader)
            cache[name] = (digests[name], _pack_logits(logits.numpy()))
        _save_cache(path, stamp, cache)
    return {k: torch.from_numpy(cache[k][1].astype(np.float32)) for k in images}


def _pack_logits(arr: np.ndarray) -> np.ndarray:
    """float16, or float32 where a value would overflow float16."""
    if arr.size and np.abs(arr).max() >= float(np.finfo(np.float16).max):
        return arr.astype(np.float32)
    return arr.astype(np.float16)


def _save_cache(path: Path, stamp: str, cache: Mapping[str, tuple[str, np.ndarray]]) -> None:
    """Write the cache atomically (never half-written)."""
    import io

    from calnotes._io import atomic_write

    names = sorted(cache)
    arrays: dict[str, np.ndarray] = {"stamp": np.array(stamp), "names": np.array(names)}
    for i, name in enumerate(names):
        arrays[f"sha256_{i}"] = np.array(cache[name][0])
        arrays[f"logits_{i}"] = cache[name][1]
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)  # type: ignore[arg-type]
    atomic_write(path, buffer.getvalue())
