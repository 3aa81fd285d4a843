"""The optional ``positive_class`` config key: hashes, validation, and a binary run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from calnotes import data
from calnotes.runs import experiment
from calnotes.runs.experiment import DEFAULT_CONFIG, OPTIONAL_CONFIG, default_config
from calnotes.runs.store import RunStore, config_hash, load_or_run

#: Chapter 1's stored run; its hash must not change when optional keys are added.
CH01_CONFIG = {"dataset": "fashion_mnist", "model": "lenet5", "epochs": 30,
               "weight_decay": 0.0, "lr": 0.05, "seed": 0}


pytestmark = pytest.mark.usefixtures("one_thread")


def test_optional_keys_are_absent_unless_set_so_old_hashes_stay() -> None:
    assert "positive_class" in OPTIONAL_CONFIG
    assert set(OPTIONAL_CONFIG).isdisjoint(DEFAULT_CONFIG)
    assert default_config() == DEFAULT_CONFIG
    assert default_config(positive_class=None) == default_config()
    # values computed before the optional key existed
    assert config_hash(default_config()) == "eaa53330a95f"
    assert config_hash(default_config(**CH01_CONFIG)) == "f0a7f9abac42"
    assert config_hash(default_config(**CH01_CONFIG, positive_class=None)) == "f0a7f9abac42"


def test_positive_class_is_kept_and_changes_the_hash() -> None:
    cfg = default_config(dataset="mnist", positive_class=9)
    assert cfg["positive_class"] == 9
    assert config_hash(cfg) != config_hash(default_config(dataset="mnist"))
    assert default_config(**cfg) == cfg  # a stored config reads back unchanged


@pytest.mark.parametrize(("value", "error"), [(True, TypeError), ("9", TypeError),
                                              (9.0, TypeError), (-1, ValueError)])
def test_positive_class_validation(value, error) -> None:
    with pytest.raises(error, match="positive_class"):
        default_config(positive_class=value)


# --------------------------------------------------------------------------- canonical values


def test_values_are_made_canonical_by_the_schema() -> None:
    # Was: `-p WEIGHT_DECAY 0` kept an int, which hashed unlike 0.0 and missed the stored run.
    cfg = default_config(weight_decay=0, lr=1, momentum=np.float32(0.5), epochs=np.int64(3),
                         augment=np.bool_(True), train_subset=np.int32(100))
    assert cfg == default_config(weight_decay=0.0, lr=1.0, momentum=0.5, epochs=3,
                                 augment=True, train_subset=100)
    for key, kind in (("weight_decay", float), ("lr", float), ("momentum", float),
                      ("epochs", int), ("augment", bool), ("train_subset", int)):
        assert type(cfg[key]) is kind, key
    assert set(experiment.CONFIG_TYPES) == set(DEFAULT_CONFIG) | set(OPTIONAL_CONFIG)
    assert json.dumps(cfg)  # plain JSON, no NumPy scalars
    assert default_config(**cfg) == cfg


def test_grad_clip_is_optional_positive_and_reaches_the_trainer() -> None:
    from calnotes.models import build_model

    assert default_config(grad_clip=None) == default_config() == DEFAULT_CONFIG
    cfg = default_config(grad_clip=2)
    assert cfg["grad_clip"] == 2.0 and type(cfg["grad_clip"]) is float
    assert config_hash(cfg) != config_hash(default_config())
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="grad_clip"):
            default_config(grad_clip=bad)
    for overrides in ({}, {"loss": "mixup"}, {"loss": "focal", "meta": {}}):
        trainer = experiment.make_trainer(default_config(grad_clip=2, **overrides),
                                          build_model("lenet5", 10, 1, 8), device="cpu")
        assert trainer.grad_clip == 2.0, overrides
    plain = experiment.make_trainer(default_config(), build_model("lenet5", 10, 1, 8),
                                    device="cpu")
    assert plain.grad_clip is None


def test_val_size_keeps_int_and_fraction_apart() -> None:
    assert type(default_config(val_size=5000)["val_size"]) is int
    assert default_config(val_size=0.2)["val_size"] == 0.2  # a fraction, not 0 images
    assert default_config(val_size=None)["val_size"] is None


def test_loss_and_meta_options_are_canonical() -> None:
    assert default_config(loss="logitnorm", loss_options={"tau": 1})["loss_options"] == {
        "tau": 1.0}
    assert type(default_config(loss="focal", loss_options={"gamma": 2})["loss_options"][
        "gamma"]) is float
    assert type(default_config(loss="mixup", loss_options={"alpha": 1})["loss_options"][
        "alpha"]) is float
    meta = default_config(loss="focal", meta={"meta_lr": 1, "heads": np.int64(4)})["meta"]
    assert type(meta["meta_lr"]) is float and type(meta["heads"]) is int
    assert default_config(model_options={"widths": (8, 16)})["model_options"] == {
        "widths": [8, 16]}


@pytest.mark.parametrize(("overrides", "match"), [
    ({"epochs": 3.0}, r"config\['epochs'\] must be int, got float"),
    ({"epochs": True}, r"config\['epochs'\] must be int, got bool"),
    ({"augment": 1}, r"config\['augment'\] must be bool"),
    ({"lr": "0.1"}, r"config\['lr'\] must be float"),
    ({"train_subset": 10.5}, r"config\['train_subset'\] must be int or None"),
    ({"model": None}, r"config\['model'\] must be str"),
    ({"model_options": {"width": object()}}, r"model_options'\]\['width'\]"),
    ({"model_options": {1: 2}}, "str keys"),
    ({"loss": "focal", "meta": {"heads": 2.0}}, r"config\['meta'\]\['heads'\] must be int"),
])
def test_wrong_types_are_errors(overrides, match) -> None:
    with pytest.raises(TypeError, match=match):
        default_config(**overrides)


def test_unknown_key_lists_optional_keys() -> None:
    with pytest.raises(ValueError, match="valid keys are .*positive_class"):
        default_config(positve_class=9)


def test_train_run_with_positive_class_is_binary(tmp_path: Path) -> None:
    config = {"dataset": "digits", "model": "lenet5", "epochs": 1, "batch_size": 64,
              "val_size": 300, "test_subset": 200, "positive_class": 9}
    result = experiment.train_run(config, device="cpu", progress=False)
    assert result.config["positive_class"] == 9
    assert isinstance(result.threads, int) and result.threads >= 1  # recorded in provenance
    assert result.test_logits.shape == (200, 2) and result.val_logits.shape == (300, 2)
    splits = data.load_dataset("digits", val_size=300, seed=0, test_subset=200)
    assert torch.equal(result.test_labels, (splits.test.labels == 9).long())
    assert torch.equal(result.val_labels, (splits.val.labels == 9).long())
    assert 0 < int(result.test_labels.sum()) < 200

    store = RunStore(tmp_path / "results")
    stored = load_or_run(config, store=store, checkpoint_root=tmp_path / "ckpt",
                         device="cpu", progress=False)
    assert stored.config == default_config(**config)
    assert stored.path.name == config_hash(default_config(**config))
    assert stored.test_logits.shape == (200, 2)


def _same_splits(a: data.DatasetSplits, b: data.DatasetSplits) -> None:
    for split in ("train", "val", "test"):
        assert torch.equal(getattr(a, split).images, getattr(b, split).images), split
        assert torch.equal(getattr(a, split).labels, getattr(b, split).labels), split
    assert (a.num_classes, a.mean, a.std, a.class_names) == (
        b.num_classes, b.mean, b.std, b.class_names)


@pytest.mark.parametrize("positive_class", [None, 3])
def test_load_splits_gives_the_splits_train_run_trains_on(monkeypatch,
                                                           positive_class) -> None:
    config = {"dataset": "digits", "val_size": 300, "seed": 2, "train_subset": 500,
              "test_subset": 200, "epochs": 1}
    if positive_class is not None:
        config["positive_class"] = positive_class

    class Seen(Exception):
        pass

    def capture(splits, **kwargs):
        raise Seen(splits)

    monkeypatch.setattr(experiment.data, "make_loaders", capture)
    with pytest.raises(Seen) as seen:
        experiment.train_run(config, device="cpu", progress=False)
    used = seen.value.args[0]
    splits = experiment.load_splits(config)
    _same_splits(splits, used)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (500, 300, 200)
    assert splits.num_classes == (10 if positive_class is None else 2)
    with pytest.raises(TypeError, match="config"):
        experiment.load_splits([("dataset", "digits")])


def test_load_splits_of_a_meta_run_lacks_its_meta_validation_images(monkeypatch) -> None:
    config = {"dataset": "digits", "val_size": 300, "seed": 2, "train_subset": 500,
              "test_subset": 200, "epochs": 1, "loss": "focal", "meta": {"meta_val_size": 120}}

    class Seen(Exception):
        pass

    def capture(splits, **kwargs):
        raise Seen(splits)

    monkeypatch.setattr(experiment.data, "make_loaders", capture)
    with pytest.raises(Seen) as seen:
        experiment.train_run(config, device="cpu", progress=False)
    splits = experiment.load_splits(config)
    _same_splits(splits, seen.value.args[0])
    assert (len(splits.train), len(splits.val), len(splits.test)) == (380, 300, 200)
    plain = experiment.load_splits({k: v for k, v in config.items() if k != "meta"})
    assert len(plain.train) == 500  # the meta split comes out of the training split only
    assert torch.equal(plain.val.images, splits.val.images)


def test_train_run_rejects_out_of_range_positive_class() -> None:
    config = {"dataset": "digits", "model": "lenet5", "epochs": 1, "val_size": 300,
              "positive_class": 10}
    with pytest.raises(ValueError, match="positive_class"):
        experiment.train_run(config, device="cpu", progress=False)


# --------------------------------------------------------------------------- meta and mixup


def test_meta_config_fills_its_options_and_changes_the_hash() -> None:
    cfg = default_config(loss="focal", meta={"outer": "dece"})
    assert cfg["meta"] == {**experiment.META_OPTIONS, "outer": "dece"}
    assert default_config(**cfg) == cfg
    assert config_hash(cfg) != config_hash(default_config(loss="focal", meta={}))
    assert config_hash(default_config(loss="focal", meta=None)) == config_hash(
        default_config(loss="focal"))


@pytest.mark.parametrize(("overrides", "error", "match"), [
    ({"loss": "focal", "meta": "sece"}, TypeError, "meta"),
    ({"loss": "focal", "meta": {"outr": "sece"}}, ValueError, "outr"),
    ({"loss": "ce", "meta": {}}, ValueError, "loss='focal'"),
    ({"loss": "focal", "meta": {"learner": "l2"}}, ValueError, "loss='ce'"),
    ({"loss": "ce", "meta": {"learner": "l2", "inner_params": "all"}}, ValueError,
     "inner_params"),
    ({"loss": "ce", "meta": {"learner": "lambda"}}, ValueError, r"\['learner'\]"),
    ({"loss": "focal", "loss_options": {"gamma": 3.0}, "meta": {}}, ValueError, "loss_options"),
    ({"loss": "focal", "meta": {"outer": "ece"}}, ValueError, r"\['outer'\]"),
    ({"loss": "focal", "meta": {"inner_reduction": "total"}}, ValueError,
     r"\['inner_reduction'\]"),
    ({"loss": "focal", "meta": {"inner_params": "body"}}, ValueError, r"\['inner_params'\]"),
    ({"loss": "focal", "meta": {"dece_form": "gaussian"}}, ValueError, r"\['dece_form'\]"),
    ({"loss": "focal", "meta": {"meta_val_size": -1}}, ValueError, r"\['meta_val_size'\]"),
    ({"loss": "focal", "meta": {"meta_val_size": 0.1}}, TypeError, r"\['meta_val_size'\]"),
])
def test_meta_config_errors(overrides, error, match) -> None:
    with pytest.raises(error, match=match):
        default_config(**overrides)


def test_make_trainer_picks_the_trainer_the_config_names() -> None:
    from calnotes.models import build_model
    from calnotes.training import MixupTrainer, Trainer
    from calnotes.training.meta import MetaCalibrationTrainer, MetaTrainer

    def build(**overrides):
        model = build_model("lenet5", 10, 1, 8)
        return experiment.make_trainer(default_config(**overrides), model, device="cpu")

    meta = build(loss="focal", meta={"outer": "dece", "heads": 3, "meta_lr": 0.01})
    assert isinstance(meta, MetaTrainer)
    assert (meta.outer, meta.gamma_net.heads, meta.meta_lr) == ("dece", 3, 0.01)
    assert (meta.inner_reduction, meta.dece_form) == ("sum", "ranked")  # the reference's
    meta = build(loss="focal", meta={"outer": "ce+0.5dece", "inner_reduction": "mean",
                                     "dece_form": "sharpened", "inner_lr": 0.2})
    assert (meta.outer, meta.inner_reduction, meta.dece_form, meta.inner_lr) == (
        "ce+0.5dece", "mean", "sharpened", 0.2)
    calibration = build(loss="ce", meta={"learner": "l2", "outer": "dece"})
    assert isinstance(calibration, MetaCalibrationTrainer)
    assert calibration.outer == "dece" and calibration.fingerprint()["trainer"] == (
        "meta-calibration")
    # a step schedule's factor reaches a meta trainer as it does a plain one
    stepped = build(loss="focal", meta={}, schedule="step", milestones=[0.5], lr_gamma=0.2,
                    epochs=4)
    assert (stepped.milestones, stepped.gamma) == ((2,), 0.2)
    mixup = build(loss="mixup", loss_options={"alpha": 0.4})
    assert isinstance(mixup, MixupTrainer) and mixup.alpha == 0.4
    plain = build(loss="focal", loss_options={"gamma": 2.0})
    assert type(plain) is Trainer and plain.loss_fn.gamma == 2.0
    with pytest.raises(ValueError, match="alpha"):
        build(loss="mixup", loss_options={"beta": 1.0})
    with pytest.raises(ValueError, match="sgd"):
        build(loss="focal", meta={}, optimizer="adam")
    assert "mixup" in experiment.available_losses()
    with pytest.raises(ValueError, match="make_trainer"):
        experiment.make_loss("mixup")


def test_train_run_of_a_meta_config_records_gamma(tmp_path: Path) -> None:
    config = {"dataset": "digits", "model": "lenet5", "epochs": 2, "batch_size": 64,
              "val_size": 300, "test_subset": 200, "loss": "focal", "meta": {}}
    result = experiment.train_run(config, device="cpu", progress=False)
    gamma_mean, gamma_std = result.history["gamma_mean"], result.history["gamma_std"]
    assert len(gamma_mean) == 2 and all(g > 0 for g in gamma_mean)
    assert all(s >= 0 for s in gamma_std)
    assert result.test_logits.shape == (200, 10)

    with pytest.raises(ValueError, match="val_size"):
        experiment.train_run({**config, "val_size": 0}, device="cpu", progress=False)


def test_train_run_of_meta_calibration_records_its_coefficients() -> None:
    config = {"dataset": "digits", "model": "lenet5", "epochs": 1, "batch_size": 64,
              "val_size": 300, "test_subset": 200, "loss": "ce",
              "meta": {"learner": "l2", "outer": "dece", "meta_val_size": 200}}
    result = experiment.train_run(config, device="cpu", progress=False)
    assert "gamma_mean" not in result.history.columns
    assert result.history["l2_std"][0] > 0 and result.test_logits.shape == (200, 10)


def _outer_source(epoch, trainer, record) -> None:
    """Records how many images the loader of the outer batches holds."""
    loader = trainer.meta_loader
    record["outer_images"] = loader.num_samples
    record["outer_is_val"] = loader is trainer._val_loader


def test_meta_runs_draw_outer_batches_from_their_own_split() -> None:
    base = {"dataset": "digits", "model": "lenet5", "epochs": 1, "batch_size": 64,
            "val_size": 300, "test_subset": 100, "loss": "focal"}
    runs = {size: experiment.train_run({**base, "meta": {"meta_val_size": size}}, device="cpu",
                                       progress=False, epoch_callback=_outer_source)
            for size in (None, 200, 0)}
    assert runs[None].history["outer_images"] == [300]  # as many as the validation split
    assert runs[200].history["outer_images"] == [200]
    assert runs[0].history["outer_images"] == [300]  # 0: the validation batches, as before
    assert runs[0].history["outer_is_val"] == [True]
    assert runs[None].history["outer_is_val"] == runs[200].history["outer_is_val"] == [False]
    for result in runs.values():  # the validation split is the same in every run
        assert result.val_logits.shape == (300, 10)
        assert torch.equal(result.val_labels, runs[0].val_labels)
    # with a meta-validation split, a run needs no validation split
    result = experiment.train_run({**base, "val_size": 0, "meta": {"meta_val_size": 200}},
                                  device="cpu", progress=False)
    assert result.val_logits is None and result.history["gamma_mean"][0] > 0


def _numbered_splits(n_train: int) -> data.DatasetSplits:
    """Splits whose images carry their own index (two bytes of the first row)."""
    def numbered(start: int, n: int) -> data.ImageData:
        ids = torch.arange(start, start + n)
        images = torch.zeros(n, 1, 2, 2, dtype=torch.uint8)
        images[:, 0, 0, 0], images[:, 0, 0, 1] = ids // 256, ids % 256
        return data.ImageData(images, ids % 3)

    return data.DatasetSplits("numbered", numbered(0, n_train), numbered(n_train, 50),
                              numbered(n_train + 50, 20), num_classes=3, in_channels=1,
                              image_size=2, mean=(0.5,), std=(0.25,))


def _ids(images: data.ImageData) -> list[int]:
    return (images.images[:, 0, 0, 0].long() * 256 + images.images[:, 0, 0, 1].long()).tolist()


def test_meta_validation_split_is_disjoint_and_deterministic() -> None:
    splits = _numbered_splits(400)
    rest, meta = experiment.meta_validation_split(splits, 100, seed=3)
    train_ids, meta_ids = _ids(rest.train), _ids(meta)
    assert len(meta_ids) == 100 and len(train_ids) == 300
    assert sorted(train_ids + meta_ids) == list(range(400))  # a partition of the training
    assert train_ids == sorted(train_ids) and meta_ids == sorted(meta_ids)  # order kept
    assert set(meta_ids).isdisjoint(_ids(rest.val)) and _ids(rest.val) == _ids(splits.val)
    assert _ids(rest.test) == _ids(splits.test)
    assert torch.equal(meta.labels, torch.tensor(meta_ids) % 3)  # labels travel along
    again = experiment.meta_validation_split(splits, 100, seed=3)[1]
    assert _ids(again) == meta_ids  # deterministic in the seed
    assert _ids(experiment.meta_validation_split(splits, 100, seed=4)[1]) != meta_ids
    assert len(experiment.meta_validation_split(splits, None, seed=3)[1]) == 50  # = val
    for size, error in ((0, ValueError), (400, ValueError), (-5, ValueError),
                        (2.5, TypeError)):
        with pytest.raises(error, match="size"):
            experiment.meta_validation_split(splits, size, seed=3)


# --------------------------------------------------------------------------- the LogitNorm recipe


REPO_RESULTS = Path(__file__).resolve().parent.parent / "results"


def test_every_stored_run_keeps_its_hash() -> None:
    """The stored runs' folders are named by their hash: new optional keys change none."""
    folders = sorted(p for p in REPO_RESULTS.iterdir() if (p / "config.json").is_file())
    if not folders:
        pytest.skip("no stored runs in this checkout")
    for folder in folders:
        stored = json.loads((folder / "config.json").read_text())
        assert config_hash(stored) == folder.name, folder
    for key in ("milestones", "lr_gamma", "flip", "grad_clip"):
        assert config_hash(default_config(**CH01_CONFIG, **{key: None})) == "f0a7f9abac42"


def test_step_milestones_and_gamma_reach_the_trainer() -> None:
    from calnotes.models import build_model

    # the LogitNorm code: MultiStepLR([80, 140], 0.1) over 200 epochs, no Nesterov
    cfg = default_config(schedule="step", milestones=[80, 140.0], lr_gamma=0.1, epochs=200,
                         lr=0.1, weight_decay=5e-4, model="wrn-16-2",
                         model_options={"dropout": 0.3}, loss="logitnorm",
                         loss_options={"tau": 0.04})
    assert cfg["milestones"] == [80, 140] and type(cfg["milestones"][1]) is int
    assert config_hash(cfg) == config_hash({**cfg, "milestones": [80, 140]})
    assert config_hash(cfg) != config_hash({k: v for k, v in cfg.items() if k != "milestones"})
    model = build_model(cfg["model"], 10, 1, 28, **cfg["model_options"])
    trainer = experiment.make_trainer(cfg, model, device="cpu", progress=False)
    assert trainer.milestones == (80, 140) and trainer.gamma == 0.1
    group = trainer.optimizer.param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"], group["nesterov"]) == (
        0.1, 0.9, 5e-4, False)
    # the same schedule as fractions of a shorter run
    short = default_config(schedule="step", milestones=[0.4, 0.7], epochs=20)
    trainer = experiment.make_trainer(short, build_model("resnet8", 10, 1, 28), device="cpu",
                                      progress=False)
    assert trainer.milestones == (8, 14) and trainer.gamma == 0.1


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"milestones": [0.5]}, ValueError, "schedule='step'"),
        ({"lr_gamma": 0.2}, ValueError, "schedule='step'"),
        ({"schedule": "step", "milestones": []}, TypeError, "non-empty list"),
        ({"schedule": "step", "milestones": ["80"]}, TypeError, "non-empty list"),
        ({"schedule": "step", "milestones": 80}, TypeError, "milestones"),
        ({"schedule": "step", "lr_gamma": 0.0}, ValueError, "lr_gamma"),
        ({"flip": True}, ValueError, "augment=True"),
        ({"augment": True, "flip": "yes"}, TypeError, "flip"),
    ],
)
def test_recipe_options_are_checked(overrides, error, match) -> None:
    with pytest.raises(error, match=match):
        default_config(**overrides)


def test_flip_overrides_the_datasets_choice(monkeypatch) -> None:
    part = data.ImageData(torch.zeros(4, 1, 28, 28, dtype=torch.uint8), torch.arange(4))
    splits = data.DatasetSplits(name="fashion_mnist", train=part, val=part, test=part,
                                num_classes=10, in_channels=1, image_size=28, mean=(0.5,),
                                std=(0.25,), allow_flip=False)
    train, _, _ = data.make_loaders(splits, 2, augment=True)
    assert train.augment is not None and train.augment.flip is False
    train, _, _ = data.make_loaders(splits, 2, augment=True, flip=True)
    assert train.augment is not None and train.augment.flip is True and train.augment.pad == 2
    with pytest.raises(ValueError, match="augment=True"):
        data.make_loaders(splits, 2, flip=True)
    # a config's flip reaches the loaders train_run builds
    seen = {}

    def spy(*args, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(data, "make_loaders", spy)
    with pytest.raises(RuntimeError, match="stop here"):
        experiment.train_run(default_config(dataset="digits", val_size=0.2, augment=True,
                                            flip=True), device="cpu", progress=False)
    assert seen["flip"] is True and seen["augment"] is True
