"""Every config option composes; typos and bad values fail at composition with Hydra's message."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from dali_train.config import load_config, register_configs
from dali_train.errors import UserError
from dali_train.options import LOADER_SCHEMAS, SCHEDULER_SCHEMAS, SgdConfig, TimmOptimizerConfig
from tests.conftest import REPO, run_script, run_train

CONF = REPO / "conf"


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.fixture
def hydra_conf():
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield
    GlobalHydra.instance().clear()


def test_default_config_composes(hydra_conf):
    cfg = compose("config")
    assert cfg.loader.name == "dali" and cfg.model.name == "resnet18" and cfg.data.name == "sample"
    assert cfg.optimizer.name == "sgd" and cfg.scheduler.name == "cosine"


@pytest.mark.parametrize("group", ["loader", "model", "optimizer", "scheduler", "data"])
def test_every_option_of_a_group_composes(hydra_conf, group):
    names = options(group)
    assert names, f"conf/{group} is empty"
    for name in names:
        cfg = compose("config", overrides=[f"{group}={name}", "data.root=/x"])
        node = cfg[group]
        # The option name, the file name and the `name` key agree (models and optimizers: timm names).
        if group in ("loader", "scheduler", "data"):
            assert node.name == name
        OmegaConf.to_container(cfg.loader, throw_on_missing=True)
        # Each option converts to its own typed schema, every value checked.
        typed = load_config(cfg)
        schema = {"loader": LOADER_SCHEMAS, "scheduler": SCHEDULER_SCHEMAS}.get(group, {}).get(name)
        if schema is not None:
            assert type(getattr(typed, group)) is schema
        if group == "optimizer":
            assert type(typed.optimizer) is (SgdConfig if name == "sgd" else TimmOptimizerConfig)


def test_default_sample_root_resolves_outside_hydra_main(hydra_conf):
    cfg = compose("config")
    assert cfg.data.root.endswith("/.cache/sample-v1") and cfg.data.generate_sample


def test_any_timm_model_by_name(hydra_conf):
    assert compose("config", overrides=["model.name=convnext_tiny"]).model.name == "convnext_tiny"


@pytest.mark.parametrize(
    "override", ["loader.batchsize=3", "optimizer.lrr=0.1", "optimizer.lr=abc", "trainer.epochs=two", "nosuchkey=1"]
)
def test_typos_and_wrong_types_fail_at_composition(hydra_conf, override):
    with pytest.raises(ConfigCompositionException):
        compose("config", overrides=[override])


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["optimizer=adamw", "optimizer.momentum=0.1"], "optimizer.momentum"),
        (["optimizer=sgd", "optimizer.betas=[0.9,0.99]"], "optimizer.betas"),
        (["loader=dali", "loader.num_workers=3"], "loader.num_workers"),
        (["loader=pytorch", "loader.num_threads=3"], "loader.num_threads"),
        (["loader=synthetic", "loader.hw_decoder_load=0.5"], "loader.hw_decoder_load"),
        (["loader=dali_cpu", "loader.hw_decoder_load=0.5"], "loader.hw_decoder_load"),
        (["scheduler=cosine", "scheduler.flat_frac=0.5"], "scheduler.flat_frac"),
        (["scheduler=step", "scheduler.min_lr=0.1"], "scheduler.min_lr"),
    ],
)
def test_a_key_of_another_option_fails_at_composition_like_a_typo(hydra_conf, overrides, key):
    with pytest.raises(ConfigCompositionException) as e:
        compose("config", overrides=overrides)
    assert e.value.__cause__.full_key == key


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["loader=pytorch", "loader.name=dali"], "loader.name=dali: not an option of this schema; choose one of pytorch"),
        (["optimizer=adamw", "optimizer.name=adamm"], "optimizer.name=adamm: not a timm optimizer"),
        (["optimizer=adamw", "optimizer.name=sgd"], "optimizer.name=sgd: use optimizer=sgd"),
        (["scheduler=flat_cos", "scheduler.flat_frac=1.0"], "scheduler.flat_frac=1.0: must be in [0, 1)"),
        (["data.val_resize_mode=long"], "data.val_resize_mode=long: unknown; choose one of shorter, whole"),
        (["trainer.mixup_alpha=0.2", "loader.batch_size=3"], "loader.batch_size=3: Mixup/CutMix needs an even"),
        (["data.val_resize=32", "data.val_size=48"], "data.val_resize=32: below data.val_size=48"),
        (["trainer.epochs_per_job=0"], "trainer.epochs_per_job=0: must be at least 1"),
        (["trainer.label_smoothing=1.5"], "trainer.label_smoothing=1.5: must be in [0, 1)"),
        (["trainer.mixup_alpha=-1"], "trainer.mixup_alpha=-1.0: must be at least 0"),
        (["trainer.ema_decay=1.0"], "trainer.ema_decay=1.0: must be in [0, 1)"),
        (["model.drop_path_rate=1.0"], "model.drop_path_rate=1.0: must be in [0, 1)"),
        (["optimizer=adamw", "optimizer.name=adan", "optimizer.betas=[0.9,0.99]"], "adan takes 3"),
        # the data keys below crashed a loader at the first batch (each loader its own way)
        (["data.crop_scale=[0.08]"], "data.crop_scale=[0.08]: must be [min, max] with 0 < min <= max"),
        (["data.crop_scale=[1.0,0.08]"], "data.crop_scale=[1.0, 0.08]: must be [min, max]"),
        (["data.crop_ratio=[0.0,1.0]"], "data.crop_ratio=[0.0, 1.0]: must be [min, max]"),
        (["data.crop_scale=[0.5,1.5]"], "data.crop_scale=[0.5, 1.5]: shares of the image's area, at most 1"),  # was taken
        (["data.train_size=0"], "data.train_size=0: must be at least 1"),
        (["data.std=[0.2,0.2,0.0]"], "std above 0"),
        # 0-255 statistics (NVIDIA's DALI examples) squeezed every input to about -2, near-constant in fp16
        (["data.mean=[123.675,116.28,103.53]", "data.std=[58.395,57.12,57.375]"], "on the 0..1 scale of pixels"),
        (["data.progressive.enabled=true", "data.progressive.step=0"], "data.progressive.step=0: must be at least 1"),
        (["data.progressive.end_epoch=-1"], "data.progressive.end_epoch=-1: must be at least 0"),
        (["seed=-1"], "seed=-1: must be in [0, 4294967296)"),
        (["trainer.clip_grad_norm=-100"], "trainer.clip_grad_norm=-100.0: must be above 0"),  # trained uphill
        (["trainer.max_val_steps=-1"], "trainer.max_val_steps=-1: must be at least 1"),  # crashed after an epoch
        (["trainer.save_every_n_steps=-1"], "trainer.save_every_n_steps=-1: must be at least 0"),
        (["trainer.cuda_max_connections=64"], "trainer.cuda_max_connections=64: must be in [0, 32]"),
        (["loader.hw_decoder_load=1.5"], "loader.hw_decoder_load=1.5: must be in [0, 1]"),
        # a DataLoader traceback, a random_ traceback, and two epochs that trained or validated nothing
        (["loader=pytorch", "loader.num_workers=-1"], "loader.num_workers=-1: must be at least 0"),
        (["loader=synthetic", "loader.synthetic_num_classes=0"], "loader.synthetic_num_classes=0: must be at least 2"),
        (["loader=synthetic", "loader.synthetic_steps=0"], "loader.synthetic_steps=0: must be at least 1"),
        (["loader=synthetic", "loader.synthetic_val_steps=0"], "loader.synthetic_val_steps=0: must be at least 1"),
    ],
)
def test_option_values_are_checked_by_the_schema_before_any_work(hydra_conf, overrides, message):
    cfg = compose("config", overrides=overrides)
    with pytest.raises(UserError) as e:
        load_config(cfg)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_each_default_exists_once_in_the_schema():
    """The option files set only what differs between options: no key restates its schema's default."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for group in ("loader", "optimizer", "scheduler", "model"):
            for name in options(group):
                schema = type(getattr(load_config(compose("config", overrides=[f"{group}={name}"])), group))
                defaults = {f.name: f.default for f in dataclasses.fields(schema)}
                for key, value in OmegaConf.load(CONF / group / f"{name}.yaml").items():
                    if key not in ("defaults", "name"):
                        assert defaults[key] != value, f"conf/{group}/{name}.yaml restates the default of {key}"
    GlobalHydra.instance().clear()


def test_imagenet_root_is_required(hydra_conf):
    cfg = compose("config", overrides=["data=imagenet"])
    assert OmegaConf.is_missing(cfg.data, "root")


@pytest.mark.slow
def test_typo_on_the_command_line_exits_before_any_work(tmp_path):
    """Hydra's composition error, as users see it: its message, exit code 2 as for UserError."""
    proc = run_train(["loader.batchsize=3", f"hydra.run.dir={tmp_path / 'run'}"], check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "batchsize" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize(
    "overrides, key",
    [(["optimizer=adamw", "optimizer.momentum=0.1"], "optimizer.momentum"), (["loader.num_workers=3"], "loader.num_workers")],
)
def test_a_key_of_another_option_is_one_error_line_and_exit_2(overrides, key, capfd):
    """`python train.py ... --cfg job` in this process (the typo test above runs that path as a subprocess)."""
    proc = run_script("train.py", *overrides, "--cfg", "job", capfd=capfd, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {key}: ") and proc.stdout == "", proc.stderr


@pytest.mark.parametrize(
    "overrides, key, schema",
    [
        (["+trainer.epoch=3"], "trainer.epoch", "TrainerConfig"),
        (["optimizer=sgd", "+optimizer.kwargs.fused=true"], "optimizer.kwargs", "SgdConfig"),
        (["+data.root_dir=/x"], "data.root_dir", "DataConfig"),
        (["+seeds=3"], "seeds", "Config"),
    ],
)
def test_a_key_added_past_the_schema_with_plus_fails_before_any_work(tmp_path, overrides, key, schema, capfd):
    """Hydra's `+` adds a key that no schema has without a word (its hint says to use it for the
    error a typo gets): the run would train without it. train.py refuses it in one line, exit 2."""
    run_dir = tmp_path / "run"
    proc = run_script("train.py", *overrides, f"hydra.run.dir={run_dir}", capfd=capfd, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {key}: not a key of ") and f"({schema})" in lines[0]
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "summary.json").exists()


def test_a_key_added_with_plus_where_the_schema_takes_any_is_kept(hydra_conf):
    """optimizer.kwargs of a timm optimizer is free-form: `+` is how a key gets there."""
    cfg = load_config(compose("config", overrides=["optimizer=adamw", "+optimizer.kwargs.foreach=false"]))
    assert cfg.optimizer.kwargs == {"foreach": False}


def test_config_prints_without_resolving_paths(capfd):
    proc = run_script("train.py", "--cfg", "job", capfd=capfd)
    assert "loader:" in proc.stdout and "name: dali" in proc.stdout
    assert "root: ${dali_train.sample_root:}" in proc.stdout  # printed as written, not resolved



def test_hydras_own_config_prints(capfd):
    """`--cfg hydra` composes Hydra's config alone (no trainer group): its output_subdir, which asks
    whether this is an evaluation, must resolve there too."""
    proc = run_script("train.py", "--cfg", "hydra", "--resolve", capfd=capfd)
    assert "output_subdir:" in proc.stdout  # "???" here: Hydra's output dir is not set before a run

def test_a_local_dataset_path_applies_to_its_option_only(tmp_path):
    """conf/local/data/imagenet.yaml sets data=imagenet's root, for recipes too; the demo's sample
    set (the default data option) keeps its own root."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf, ignore=shutil.ignore_patterns("local"))
    (conf / "local" / "data").mkdir(parents=True)
    (conf / "local" / "data" / "imagenette.yaml").write_text("root: /data/imagenette\n")
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        assert compose("config", overrides=["+experiment=imagenette_128_5ep"]).data.root == "/data/imagenette"
        assert compose("config", overrides=["data=imagenette", "data.root=/x"]).data.root == "/x"
        assert compose("config").data.name == "sample" and "sample" in str(compose("config").data.root)
    GlobalHydra.instance().clear()


@pytest.mark.parametrize("loader, key, value", [("pytorch", "num_workers", 3), ("dali_cpu", "num_threads", 2)])
def test_each_loader_reads_its_own_local_file(tmp_path, loader, key, value):
    """conf/local/loader/NAME.yaml (what benchmark.py --tune writes for dali) applies to that loader
    only; only dali's was read before, the others were silently ignored."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf, ignore=shutil.ignore_patterns("local"))
    (conf / "local" / "loader").mkdir(parents=True)
    (conf / "local" / "loader" / f"{loader}.yaml").write_text(f"{key}: {value}\n")
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        assert compose("config", overrides=[f"loader={loader}"]).loader[key] == value
        assert compose("config").loader.name == "dali" and compose("config").loader.get(key) != value
    GlobalHydra.instance().clear()


def test_a_progressive_resize_setting_without_the_ramp_on_is_a_warning(hydra_conf, caplog):
    """data.progressive sizes without data.progressive.enabled=true trained at data.train_size without a word."""
    ramp = ["data.progressive.start_size=32", "data.progressive.end_size=64"]
    with caplog.at_level("WARNING", logger="dali_train.config"):
        load_config(compose("config", overrides=ramp))
    assert caplog.messages == [
        "not used, the feature being off: data.progressive.start_size=32; data.progressive.end_size=64 "
        "(data.progressive.enabled=false)"
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="dali_train.config"):
        load_config(compose("config", overrides=[*ramp, "data.progressive.enabled=true", "data.progressive.end_epoch=3"]))
    assert caplog.messages == []


def test_a_setting_of_a_feature_that_is_off_is_a_warning(hydra_conf, caplog):
    """`trainer.compile_mode=max-autotune` without `trainer.compile=true` (or an EMA decay without the
    EMA) was ignored without a word; with the feature on, nothing is said."""
    off = compose("config", overrides=["trainer.compile_mode=max-autotune", "trainer.ema_warmup=true"])
    with caplog.at_level("WARNING", logger="dali_train.config"):
        load_config(off)
    assert caplog.messages == [
        "not used, the feature being off: trainer.compile_mode=max-autotune (trainer.compile=false); "
        "trainer.ema_warmup=True (trainer.ema=false)"
    ]
    caplog.clear()
    on = compose("config", overrides=["trainer.compile=true", "trainer.compile_mode=max-autotune", "trainer.ema=true"])
    with caplog.at_level("WARNING", logger="dali_train.config"):
        load_config(on)
    assert caplog.messages == []
