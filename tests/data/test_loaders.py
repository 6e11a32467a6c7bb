"""The batch contract of every loader, on real JPEGs decoded by real DALI CPU pipelines."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from PIL import Image

from dali_train.config import load_config, register_configs
from dali_train.data import DatasetError, NextEpoch, build_loaders, progressive_size
from dali_train.data.dali_graph import Placement, _decoder_kwargs, list_lines, reader_source
from dali_train.data.order import epoch_order
from dali_train.distributed import DistInfo
from dali_train.options import DaliLoaderConfig
from dali_train.throughput import Endless
from tests.conftest import REPO
from tests.data.damage import damage_huffman_table, enlarge_frame

CPU = torch.device("cpu")


def make_cfg(root, *overrides):
    """The typed config; DALI loaders (the default loader is dali) with 2 threads."""
    loader = next((o.split("=", 1)[1] for o in overrides if o.startswith("loader=")), "dali")
    threads = ["loader.num_threads=2"] if loader.startswith("dali") else []
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return load_config(compose("config", overrides=["data=imagenet", f"data.root={root}", *threads, *overrides]))


def workers(name: str, n: int) -> list[str]:
    """The parallelism key of loader `name` (each loader option has its own keys)."""
    return [f"loader.num_workers={n}"] if name == "pytorch" else []


def loaders(root, *overrides, rank=0, world=1):
    """Loaders of one rank; ranks > 1 are simulated in this process, without a process group, so
    the (collective) pre-flight check is off there: test_train's torchrun runs cover it."""
    checks = [] if world == 1 else ["data.verify_files=false"]
    cfg = make_cfg(root, *checks, *overrides)
    dist = DistInfo(rank, rank, world)
    return build_loaders(cfg.data, cfg.loader, dist, CPU, half=False, channels_last=True, seed=cfg.seed)


SMALL = ["data.train_size=32", "data.val_resize=36", "data.val_size=32", "loader.batch_size=16"]


@pytest.mark.parametrize("name", ["dali_cpu", "pytorch"])
def test_a_partial_validation_pass_restarts_at_the_first_batch_next_time(sample_root, name):
    """trainer.max_val_steps stops validation mid-way: the next pass starts at the first batch
    again (DALI cannot reset a pipeline mid-epoch: it is rebuilt), and a full pass sees every image."""
    ld = loaders(sample_root, f"loader={name}", *workers(name, 1), *SMALL)
    firsts = [next(iter(ld.val))[1] for _ in range(3)]  # each pass abandoned after one batch
    assert all(torch.equal(firsts[0], f) for f in firsts[1:])
    assert sum(labels.shape[0] for _, labels in ld.val) == ld.num_val_files


@pytest.mark.parametrize("name", ["dali", "dali_cpu", "pytorch"])
def test_train_batches_follow_the_contract(sample_root, name):
    ld = loaders(sample_root, f"loader={name}", *workers(name, 2), *SMALL)
    ld.train.set_epoch(0)
    batches = list(ld.train)
    assert len(batches) == len(ld.train) == -(-400 // 16)
    images, labels = batches[0]
    assert images.shape == (16, 3, 32, 32) and images.dtype == torch.float32
    assert labels.dtype == torch.int64 and labels.shape == (16,)
    assert 0 <= labels.min() and labels.max() < 10
    # Normalized with ImageNet mean/std: roughly zero-centred, unit-scale values.
    assert -1.0 < images.mean().item() < 1.0 and 0.3 < images.std().item() < 2.0


def test_real_imagenette_jpegs_including_grayscale(imagenette_mini):
    ld = loaders(imagenette_mini, "loader=dali_cpu", "loader.batch_size=8")
    seen = []
    for images, labels in ld.val:
        assert images.shape[1:] == (3, 224, 224) and images.dtype == torch.float32
        seen.extend(labels.tolist())
    assert seen == ld.dataset.val.labels  # val is unshuffled: labels arrive in file order
    ld.train.set_epoch(0)
    images, labels = next(iter(ld.train))
    assert images.shape == (8, 3, 224, 224) and torch.isfinite(images).all()


@pytest.mark.parametrize("world", [1, 2, 3])
def test_val_sees_every_file_exactly_once_at_any_world_size(sample_root, world):
    per_rank = []
    for rank in range(world):
        ld = loaders(sample_root, "loader=dali_cpu", *SMALL, "loader.batch_size=7", rank=rank, world=world)
        labels = [lab for _, lab in ld.val]
        assert len(labels) == len(ld.val)
        per_rank.append(torch.cat(labels).tolist())
    # Contiguous shards of the sorted file list, padded duplicates dropped.
    assert sum(per_rank, []) == ld.dataset.val.labels


def test_fewer_val_files_than_processes_is_one_line_at_start(tmp_path):
    """Each rank validates a contiguous shard: with fewer val files than ranks one shard is empty,
    which DALI refused after the first epoch and a DataLoader rank sat alone in a collective with."""
    from dali_train.data.sample import make_image_folder

    root = make_image_folder(tmp_path / "tiny", num_classes=2, train_per_class=2, val_per_class=1)
    with pytest.raises(DatasetError, match=r"val: 2 val files for 3 processes; each needs at least one"):
        loaders(root, "loader=dali_cpu", *SMALL, rank=0, world=3)
    assert len(loaders(root, "loader=dali_cpu", *SMALL, rank=1, world=2).val) == 1


@pytest.mark.parametrize("world", [2, 3])
def test_train_step_counts_match_across_ranks_and_cover_the_set(small_root, world):
    steps, labels = [], []
    for rank in range(world):
        ld = loaders(small_root, "loader=dali_cpu", *SMALL, "loader.batch_size=8", rank=rank, world=world)
        ld.train.set_epoch(1)
        batches = list(ld.train)
        steps.append(len(batches))
        labels.extend(torch.cat([lab for _, lab in batches]).tolist())
    assert len(set(steps)) == 1 and steps[0] == len(ld.train)
    per_class = torch.bincount(torch.tensor(labels), minlength=10)
    assert per_class.min() >= 12  # 12 train files per class: every one seen, a few twice


@pytest.mark.parametrize("shape", [(375, 500), (500, 357), (224, 300)])  # ImageNet-like; long sides 341, 359, 343
@pytest.mark.parametrize("sizes", [("256", "224"), ("73", "64")])  # crop offsets 58.5 / 4.5 px: half a pixel
def test_dali_cpu_and_pytorch_val_resize_and_crop_to_the_same_pixels(tmp_path, shape, sizes):
    """An image of distinct columns and rows, val-resized and center-cropped by both loaders: the
    same geometry (long side, crop offset), so the same pixels up to the resize filters' differences.
    The geometry of torchvision's Resize and CenterCrop (truncated long side, offsets rounded half
    to even) moved one channel's mean by 1.7 to 19 levels in these cases; the filters' own
    difference stays under 1.2 (the 5x downscale to 73 px)."""
    h, w = shape
    rows, cols = np.mgrid[0:h, 0:w]
    image = np.stack([np.abs((rows * 4) % 500 - 250), np.abs((cols * 4) % 500 - 250), rows * 0 + 128], -1)
    image = image.astype(np.uint8)  # triangle waves of 4 levels per pixel along each axis
    for split in ("train", "val"):
        (tmp_path / split / "c").mkdir(parents=True)
        Image.fromarray(image).save(tmp_path / split / "c" / "x.png")
    over = [f"data.val_resize={sizes[0]}", f"data.val_size={sizes[1]}", "loader.batch_size=1"]
    (xa, _), (xb, _) = (
        next(iter(loaders(tmp_path, f"loader={name}", *over, *workers(name, 0)).val)) for name in ("dali_cpu", "pytorch")
    )
    per_channel = (xa - xb).abs().mean(dim=(0, 2, 3))  # a shift along one axis moves one channel
    assert per_channel.max().item() < 1.5 / 255 / 0.224, per_channel  # normalized units: 1.5 8-bit levels


def test_dali_cpu_and_pytorch_val_tensors_agree(imagenette_mini):
    """Same files, same normalization; the resize filters differ (DALI triangular vs PIL bilinear
    with antialias). Measured on the 80 val images of imagenette-mini (224 px -> 256 -> crop 224):
    mean |diff| 0.0028, max 0.0175 = one 8-bit level (1/255/0.224) in normalized units."""
    a = loaders(imagenette_mini, "loader=dali_cpu", "loader.batch_size=16")
    b = loaders(imagenette_mini, "loader=pytorch", "loader.batch_size=16", "loader.num_workers=0")
    (xa, ya), (xb, yb) = next(iter(a.val)), next(iter(b.val))
    assert torch.equal(ya, yb)
    diff = (xa - xb).abs()
    assert diff.mean().item() < 0.01
    assert diff.max().item() < 3 / 255 / 0.224  # within three 8-bit levels everywhere


def test_synthetic_loader(sample_root):
    ld = loaders(sample_root, "loader=synthetic", "loader.synthetic_steps=3", "loader.batch_size=4", *SMALL[:3])
    batches = list(ld.train)
    assert len(batches) == 3 and batches[0][0].shape == (4, 3, 32, 32) and batches[0][1].dtype == torch.int64


def test_progressive_resizing_schedule(sample_root):
    cfg = make_cfg(
        sample_root,
        "data.progressive.enabled=true",
        "data.progressive.start_size=160",
        "data.progressive.end_size=192",
        "data.progressive.start_epoch=2",
        "data.progressive.end_epoch=6",
        "data.progressive.step=8",
    )
    size = progressive_size(cfg.data)
    assert [size(e) for e in range(8)] == [160, 160, 160, 168, 176, 184, 192, 192]


def test_progressive_size_reaches_the_pipeline(sample_root):
    ld = loaders(
        sample_root,
        "loader=dali_cpu",
        *SMALL,
        "data.progressive.enabled=true",
        "data.progressive.start_size=24",
        "data.progressive.end_size=40",
        "data.progressive.end_epoch=2",
        "data.progressive.step=8",
    )
    shapes = []
    for epoch in range(3):
        ld.train.set_epoch(epoch)
        shapes.append(next(iter(ld.train))[0].shape[-1])
    assert shapes == [24, 32, 40]


def plant(path: str) -> str:
    """Damage a JPEG's Huffman table in place: it passes the startup check, DALI cannot decode it."""
    Path(path).write_bytes(damage_huffman_table(Path(path).read_bytes()))
    return path


def epoch_batches(loader, epoch: int) -> Iterator:
    """The batches of `epoch`; set_epoch's own error (DALI reads batch 0 as it builds) included."""
    loader.set_epoch(epoch)
    yield from loader


def dataset_error(batches: Iterable) -> tuple[str, int]:
    """The DatasetError that iterating `batches` raises, as text, and the batches before it.

    Caught here, not by pytest.raises: a test frame holding the error's traceback is a reference
    cycle holding the loader, and a DataLoader iterator freed by gc rather than with its loader
    waits 5 s (its join timeout) for its workers: its queues are closed before it can stop them."""
    seen = 0
    try:
        for _ in batches:
            seen += 1
    except DatasetError as e:
        return str(e), seen
    raise AssertionError("no DatasetError")


def assert_names(text: str, path: str) -> None:
    assert path in text and "\n" not in text and "data.exclude_list" in text, text


@pytest.fixture
def copied_root(small_root, tmp_path) -> Path:
    shutil.copytree(small_root, tmp_path / "data")
    return tmp_path / "data"


# One DataLoader worker in the damaged-file tests: one process to start and stop.
@pytest.mark.parametrize("name", ["dali_cpu", "pytorch"])
@pytest.mark.parametrize("folder", ["n00000000", "n00000007"])  # the first batch (read as DALI builds), a later one
def test_a_damaged_val_file_is_a_one_line_error_naming_it(copied_root, name, folder):
    bad = plant(str(sorted(copied_root.glob(f"val/{folder}/*.JPEG"))[0]))
    ld = loaders(copied_root, f"loader={name}", *workers(name, 1), *SMALL, "loader.batch_size=8")
    assert bad in ld.dataset.val.files  # the startup check let it through
    text, _ = dataset_error(ld.val)
    assert_names(text, bad)



@pytest.mark.parametrize("name", ["dali_cpu", "pytorch"])
def test_a_val_file_claiming_a_huge_size_is_a_one_line_error_naming_it(copied_root, name):
    """A frame header of 40000 x 40000 px (1.6 gigapixels): PIL's decompression-bomb guard raises an
    error of its own class, which the PyTorch loader let through as a traceback mid-epoch."""
    path = sorted(copied_root.glob("val/n00000007/*.JPEG"))[0]
    path.write_bytes(enlarge_frame(path.read_bytes(), 40000, 40000))
    ld = loaders(copied_root, f"loader={name}", *workers(name, 1), *SMALL, "loader.batch_size=8")
    assert str(path) in ld.dataset.val.files  # the startup check let it through
    text, _ = dataset_error(ld.val)
    assert_names(text, str(path))

@pytest.mark.parametrize("name", ["dali_cpu", "pytorch"])
@pytest.mark.parametrize("batch", [0, 9])
def test_a_damaged_train_file_is_a_one_line_error_naming_it(copied_root, name, batch):
    """Batch 0 of epoch 1: DALI decodes it while the iterator is built, in set_epoch(1), which
    train.py runs on a thread while validating epoch 0. Batch 9: mid-epoch, beyond DALI's prefetch."""
    ld = loaders(copied_root, f"loader={name}", *workers(name, 1), *SMALL, "loader.batch_size=8")
    ld.train.set_epoch(0)
    assert len(list(ld.train)) == 15  # a clean epoch 0
    order = epoch_order(120, seed=0, epoch=1, batch_size=8, world_size=1).rank_block(0, 1)
    bad = plant(ld.dataset.train.files[order[batch * 8 + 3]])
    text, seen = dataset_error(epoch_batches(ld.train, 1))
    assert_names(text, bad)
    assert seen <= batch


def test_next_epoch_builds_on_a_thread_and_hands_its_error_to_join(copied_root):
    """train.py builds the next epoch's DALI pipeline on a thread while the main thread validates:
    the epoch built there is the one a synchronous build gives; a damaged file in its first batch
    (decoded during the build) comes back from join(), named, instead of dying on the thread."""
    ld = loaders(copied_root, "loader=dali_cpu", *SMALL, "loader.batch_size=8")
    ld.train.set_epoch(0)
    assert len(list(ld.train)) == 15
    builds = len(ld.train.build_times)
    next_epoch = NextEpoch(ld.train, 1, CPU)
    val_batches = sum(1 for _ in ld.val)  # the main thread validates meanwhile
    assert next_epoch.join() is None and val_batches == len(ld.val)
    assert (ld.train.epoch, len(ld.train.build_times)) == (1, builds + 1)  # built there, not lazily here
    threaded = [labels.clone() for _, labels in ld.train]
    same = loaders(copied_root, "loader=dali_cpu", *SMALL, "loader.batch_size=8")
    same.train.set_epoch(1)
    assert [labels.tolist() for labels in threaded] == [labels.tolist() for _, labels in same.train]
    order = epoch_order(120, seed=0, epoch=2, batch_size=8, world_size=1).rank_block(0, 1)
    bad = plant(ld.dataset.train.files[order[3]])  # batch 0 of epoch 2
    joined_at_once = NextEpoch(ld.train, 2, CPU)  # nothing to overlap: join() waits the whole build
    error = joined_at_once.join()
    assert isinstance(error, DatasetError)
    assert_names(str(error), bad)
    assert joined_at_once.waited_s > 0  # what train.py logs as next_epoch_wait_s


def open_lists(folder: Path) -> list[str]:
    """This process's open files in `folder` (unnamed temporary files included)."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # closed meanwhile (the listing's own fd)
            pass
    return [t for t in targets if t.startswith(str(folder))]


@pytest.mark.parametrize(
    ("odd", "temp", "given_as"),
    [
        ("with space 3.JPEG", "lists", "file_list"),  # a space and a digit before the extension: one line
        ("line\nbreak.JPEG", "lists", "files"),  # cannot be a line: lists
        ("plain.JPEG", "missing", "files"),  # a temp folder that takes no file: lists, not a failed run
    ],
)
def test_dali_reads_files_by_any_name_in_the_epoch_order(copied_root, tmp_path, monkeypatch, odd, temp, given_as):
    """DALI gets each epoch's files as a list file (fast to build) or, where that cannot be, as
    lists: either way every file is read as named, with its label, in the epoch's order, and no
    list file stays behind."""
    for split in ("train", "val"):
        first = sorted((copied_root / split / "n00000004").iterdir())[0]
        first.rename(first.with_name(odd))
    (tmp_path / "lists").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / temp))
    ld = loaders(copied_root, "loader=dali_cpu", *SMALL, "loader.batch_size=8")
    train = ld.dataset.train
    assert any(f.endswith(odd) for f in train.files)
    source, list_file = reader_source(train, None, list_lines(train))
    assert given_as in source and (list_file is None) == (given_as == "files")
    assert len(open_lists(tmp_path / "lists")) == (list_file is not None)  # an unnamed file, still seen open
    if list_file is not None:
        list_file.close()
    ld.train.set_epoch(1)
    labels = torch.cat([batch_labels for _, batch_labels in ld.train]).tolist()
    order = epoch_order(len(train.files), seed=0, epoch=1, batch_size=8, world_size=1).rank_block(0, 1)
    assert labels == [train.labels[i] for i in order]
    val_labels = torch.cat([batch_labels for _, batch_labels in ld.val]).tolist()
    assert val_labels == ld.dataset.val.labels
    assert not list((tmp_path / "lists").iterdir()) and not open_lists(tmp_path / "lists")  # none left, none open


def test_a_pipeline_dali_cannot_build_is_one_line_not_a_decode_error(sample_root, monkeypatch):
    """A build failure (here: a list file DALI cannot open) is no file's fault: DALI's own first
    line, with the split, instead of a hunt for undecodable files."""
    import dali_train.data.dali as dali_module

    monkeypatch.setattr(
        dali_module, "reader_source", lambda split, indices, lines: ({"file_list": "/nonexistent/list"}, None)
    )
    ld = loaders(sample_root, "loader=dali_cpu", *SMALL)
    with pytest.raises(DatasetError, match=r"DALI could not build the train pipeline over .*train: ") as e:
        ld.train.set_epoch(0)
    assert "\n" not in str(e.value) and "could not decode" not in str(e.value)


def test_a_build_error_says_dalis_reason_not_its_heading(sample_root):
    """DALI's reason is in the one line (its first line is only "Critical error when building
    pipeline:"). The build error here: its reader refusing more shards than files, which
    build_loaders now refuses at start (the test above), so the val loader is given 200 ranks after."""
    ld = loaders(sample_root, "loader=dali_cpu", *SMALL, rank=1, world=2)
    ld.val.dist = DistInfo(1, 1, 200)
    with pytest.raises(DatasetError, match=r"DALI could not build the val pipeline over .*val: .*shards: 200") as e:
        next(iter(ld.val))
    assert "\n" not in str(e.value)


def test_a_pipeline_failure_no_file_explains_blames_no_file(sample_root):
    """DALI failing for a reason of its own (memory, here std::bad_alloc in an operator, as DALI
    words it) over files that all decode: DALI's reason in one line, not "could not decode a file"
    with a hint to exclude innocent files."""
    ld = loaders(sample_root, "loader=dali_cpu", *SMALL)
    failure = RuntimeError(
        "Critical error in pipeline:\nError in CPU operator `nvidia.dali.fn.crop_mirror_normalize`,\n"
        "which was used in the pipeline definition with the following traceback:\n\n  File \"x.py\", line 1\n\n"
        "encountered:\n\nstd::bad_alloc\nCurrent pipeline object is no longer valid."
    )
    error = ld.val._decode_error(0, failure)
    assert not isinstance(error, DatasetError), error
    reading = min(len(ld.val.split), 16 * (ld.val.settings.prefetch_queue_depth + 1))  # batch 16 and the prefetched
    assert str(error) == (
        f"DALI's val pipeline failed (validation batch 0) on no file that fails to decode among the {reading} it was "
        "reading: Error in CPU operator `nvidia.dali.fn.crop_mirror_normalize`: std::bad_alloc"
    )


def dali_threads() -> int:
    """DALI's native threads in this process (its thread pools and the reader's prefetch thread)."""
    names = [Path(f"/proc/self/task/{tid}/comm").read_text() for tid in os.listdir("/proc/self/task")]
    return sum(name.startswith(("[DALI]", "PrefetchWorker")) for name in names)


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_pass_left_mid_way_shuts_its_pipeline_down_at_once(sample_root, split):
    """A pipeline left mid-epoch (a benchmark window, max_steps_per_epoch, max_val_steps) sat in a
    reference cycle on the GPU and kept its threads and device buffers until the cycle collector
    ran (docs/h200/pipeline_lifetime_2026-12-02); a reference held here stands in for that cycle.
    The next pass starts the epoch again."""
    loader = getattr(loaders(sample_root, "loader=dali_cpu", *SMALL), split)
    before = dali_threads()
    loader.set_epoch(0)
    batches = iter(loader)
    first_labels = next(batches)[1]
    held = loader._iterator  # noqa: F841 - what the cycle held on the GPU
    assert dali_threads() > before
    batches.close()
    assert dali_threads() == before
    assert torch.equal(next(iter(loader))[1], first_labels)


class HeldPasses:
    """A loader whose passes something else also holds: then only closing the pass itself ends it, as
    on Python 3.12, where closing the benchmark's outer generator did not finalize the pass inside it."""

    def __init__(self, loader) -> None:
        self.loader, self.passes = loader, []

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        self.loader.set_epoch(epoch, start_step)

    def __iter__(self):
        self.passes.append(iter(self.loader))
        return self.passes[-1]


def test_closing_a_benchmarks_batches_ends_the_loaders_pass_and_its_pipeline(sample_root):
    """benchmark.py leaves each row's epoch mid-way and closes its `Endless`: that must end the
    loader's pass (and so shut its pipeline down) even while something else still holds the pass."""
    held = HeldPasses(loaders(sample_root, "loader=dali_cpu", *SMALL).train)
    before = dali_threads()
    batches = Endless(held)
    next(batches)
    assert dali_threads() > before
    batches.close()
    assert dali_threads() == before and held.passes


def test_a_pass_that_ends_after_the_next_epoch_is_built_leaves_that_pipeline_alone(sample_root):
    """A pass can end late (the cycle collector finalizes it, on any thread) after set_epoch has built
    the next epoch's pipeline behind validation: that pipeline is the one the next epoch uses."""
    loader = loaders(sample_root, "loader=dali_cpu", *SMALL).train
    loader.set_epoch(0)
    stale = iter(loader)
    next(stale)
    loader.set_epoch(1)
    stale.close()
    assert sum(1 for _ in loader) == len(loader)
    assert len(loader.build_times) == 2  # epoch 1's pipeline was not shut down and built again


def test_an_epoch_read_to_its_last_batch_is_shut_down_by_the_next_set_epoch(sample_root):
    """The engine stops at an epoch's last batch (DALI never says the epoch ended): that pipeline is
    left for set_epoch, which shuts it down on NextEpoch's thread behind validation, not inside the
    epoch's time; a pass over the same epoch again reads all of it."""
    loader = loaders(sample_root, "loader=dali_cpu", *SMALL).train
    before = dali_threads()
    loader.set_epoch(0)
    one_pipeline = dali_threads() - before
    for step, _ in enumerate(loader, start=1):
        if step == len(loader):
            break
    assert dali_threads() - before == one_pipeline  # still there, for set_epoch
    loader.set_epoch(1)
    assert dali_threads() - before == one_pipeline  # the old one shut down, the next one built
    assert sum(1 for _ in loader) == len(loader)
    assert sum(1 for _ in loader) == len(loader)  # read to its end: the next pass builds it again


def test_the_hardware_decoders_buffer_hints_go_to_the_train_pipeline_only():
    """loader=dali's preallocate hints paid in train throughput on the H200; the validation decoder
    would hold their GPU memory for nothing measured. 0 leaves DALI's own sizing."""
    mixed = Placement("mixed", True, 0)
    settings = DaliLoaderConfig(name="dali")
    train = _decoder_kwargs(mixed, settings)
    assert (train["preallocate_width_hint"], train["preallocate_height_hint"]) == (5980, 6430)
    assert "preallocate_width_hint" not in _decoder_kwargs(mixed, settings, train=False)
    assert "preallocate_width_hint" not in _decoder_kwargs(mixed, DaliLoaderConfig(name="dali", preallocate_width_hint=0))
    assert "preallocate_width_hint" not in _decoder_kwargs(Placement("cpu", False, None), settings)
