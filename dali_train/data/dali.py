"""`DaliLoader`: batches of a split from the DALI graphs of `data.dali_graph`, one pipeline per epoch.

The train pipeline is rebuilt every epoch (`set_epoch`): its file list is that epoch's order
(`order.epoch_order`), its seed derives from (seed, epoch, rank), and its crop side may follow the
progressive-resize schedule. That makes a resumed epoch replay exactly (resumed in its middle: the
same files in the same order, but other random crops and flips, as the pipeline's seed restarts
there), at the cost of one pipeline build per epoch (0.6-2.5 s on an H200 over 160k files, 4.6 s
over ImageNet's 1.28M), which fit.Fit runs on a thread during validation (`data.NextEpoch`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch
from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

from dali_train.data.dali_graph import (
    Placement,
    decode_one_pipeline,
    list_lines,
    reader_source,
    train_pipeline,
    val_pipeline,
)
from dali_train.data.folder import EXCLUDE_HINT, DatasetError, Split
from dali_train.data.order import EpochOrder, contiguous_shard, epoch_order, steps_per_epoch
from dali_train.data.transform import Transform
from dali_train.distributed import DistInfo
from dali_train.errors import UserError
from dali_train.options import DaliCpuLoaderConfig

log = logging.getLogger(__name__)


class DaliLoader:
    """Batches `(images, labels)` of one split on this rank's device; see `data.Loader`."""

    def __init__(
        self,
        split: Split,
        *,
        train: bool,
        batch_size: int,
        dist: DistInfo,
        device: torch.device,
        placement: Placement,
        settings: DaliCpuLoaderConfig,
        transform: Transform,
        seed: int,
        train_size_at: Callable[[int], int],
    ) -> None:
        self.split, self.train, self.batch_size = split, train, batch_size
        self.dist, self.device, self.placement = dist, device, placement
        self.settings, self.transform, self.seed = settings, transform, seed
        self.train_size_at = train_size_at  # epoch -> crop side (progressive resizing)
        self.epoch, self.start_step = 0, 0
        self._iterator: DALIGenericIterator | None = None
        self._pipe = None  # the iterator's pipeline, shut down explicitly (`_drop_pipeline`)
        self._spent = False  # the iterator's train epoch was read to its end: the next pass rebuilds
        self.build_times: list[tuple[float, float]] = []  # (pipeline build s, first batch s) per build

    @functools.cached_property
    def _lines(self) -> np.ndarray | None:
        return list_lines(self.split)

    def __len__(self) -> int:
        if self.train:
            return steps_per_epoch(len(self.split), self.batch_size, self.dist.world_size) - self.start_step
        shard = contiguous_shard(len(self.split), self.dist.rank, self.dist.world_size)
        return -(-len(shard) // self.batch_size)

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Build this epoch's train pipeline now, so DALI prefetches before the first step. A
        build takes 0.6-2.5 s on an H200 (`build_times`); fit.Fit calls this for the next epoch
        on a thread while it validates (`data.NextEpoch`), so build and prefetch overlap
        validation. Calling again for the same epoch is free. Not while a pass over this loader is
        running: the pipeline it reads is shut down here."""
        if self.train and (self._iterator is None or (epoch, start_step) != (self.epoch, self.start_step)):
            self.epoch, self.start_step = epoch, start_step
            self._drop_pipeline()  # the last epoch's, shut down here: on NextEpoch's thread in training
            self._iterator = self._build()
        self.epoch, self.start_step = epoch, start_step

    def _pipe_kwargs(self, seed: int) -> dict:
        s, p = self.settings, self.placement
        return dict(
            batch_size=self.batch_size,
            num_threads=s.num_threads,
            device_id=p.device_id,
            seed=seed % (2**31),
            prefetch_queue_depth=s.prefetch_queue_depth,
            exec_dynamic=s.exec_dynamic,
            shard_id=self.dist.rank,
            num_shards=self.dist.world_size,
            placement=p,
            settings=s,
            t=self.transform,
        )

    def _order(self) -> EpochOrder:
        """This epoch's train order (all ranks' blocks), from the resume point on."""
        return epoch_order(
            len(self.split),
            seed=self.seed,
            epoch=self.epoch,
            batch_size=self.batch_size,
            world_size=self.dist.world_size,
            start_step=self.start_step,
        )

    def _build(self) -> DALIGenericIterator:
        started = time.perf_counter()
        source, list_file = reader_source(self.split, self._order().indices if self.train else None, self._lines)
        try:
            if self.train:
                seed = self.seed * 1_000_003 + self.epoch * 1009 + self.dist.rank
                pipe = train_pipeline(source, size=self.train_size_at(self.epoch), **self._pipe_kwargs(seed))
                policy = LastBatchPolicy.DROP  # every shard is an exact number of batches anyway
            else:
                pipe = val_pipeline(source, **self._pipe_kwargs(self.seed + 7))
                policy = LastBatchPolicy.PARTIAL  # drop the padded duplicates: exact val counts
            self._pipe = pipe  # shut down with the next one's build even if this one fails below
            pipe.build()  # the reader reads the list file here, once; no image is decoded yet
        except RuntimeError as e:  # not a file's fault: say what DALI says, in one line
            what = "train" if self.train else "val"
            raise DatasetError(f"DALI could not build the {what} pipeline over {self.split.root}: "
                               f"{dali_reason(e)}") from None  # fmt: skip
        finally:
            if list_file is not None:
                list_file.close()
        try:
            built = time.perf_counter()
            # The iterator runs the pipeline for its first batches before it returns, so a bad
            # file there fails here: in set_epoch, i.e. during the previous epoch's validation.
            iterator = DALIGenericIterator(
                pipe, ["images", "labels"], reader_name="Reader", last_batch_policy=policy, auto_reset=True
            )
        except RuntimeError as e:
            if not _is_pipeline_error(e):
                raise
            raise self._decode_error(0, e) from None
        self.build_times.append((built - started, time.perf_counter() - built))
        log.debug(
            "%s pipeline: build %.2f s, first batch %.2f s", "train" if self.train else "val", *self.build_times[-1]
        )
        return iterator

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._iterator is None or self._spent:
            self._drop_pipeline()
            self._iterator = self._build()
        iterator, done, finished = self._iterator, 0, False
        try:
            for batch in iterator:
                images, labels = batch[0]["images"], batch[0]["labels"]
                if self.transform.channels_last:
                    images = images.permute(0, 3, 1, 2)  # NHWC storage viewed as NCHW: no copy
                # Labels: int32 [N, 1] from the reader -> int64 [N]; no copy when already on device.
                labels = labels.view(-1).to(self.device, torch.int64, non_blocking=True)
                done += 1  # before the yield: a pass closed there has read this batch
                yield images.to(self.device, non_blocking=True), labels
            finished = True
        except RuntimeError as e:
            if not _is_pipeline_error(e):
                raise
            self._drop_pipeline(iterator)  # a pipeline that failed cannot run again
            raise self._decode_error(done, e) from None
        finally:
            if self.train and (finished or done == len(self)):
                # The epoch read to its end (the engine stops at its last batch): set_epoch shuts the
                # pipeline down, on NextEpoch's thread behind validation, not in this epoch's time.
                if iterator is self._iterator:
                    self._spent = True
            elif not finished:
                # A pass left mid-way (max_steps_per_epoch, max_val_steps, a benchmark's window) would
                # resume there next time: DALI cannot reset a pipeline mid-epoch, so the next pass
                # rebuilds it, from the epoch's start_step.
                self._drop_pipeline(iterator)

    def _drop_pipeline(self, iterator: DALIGenericIterator | None = None) -> None:
        """Forget the pipeline and shut it down now. One left mid-epoch on a GPU sits in a reference
        cycle (docs/h200/pipeline_lifetime_2026-12-02): its ~20 threads and its device buffers stayed
        until the cycle collector ran. `_shutdown` is what DALI's own exit hook calls on each pipeline.
        `iterator`: only if it is still the current one (a pass finalized late, by the collector on
        any thread, must not shut down the pipeline that set_epoch has built since)."""
        if iterator is not None and iterator is not self._iterator:
            return
        pipe, self._pipe, self._iterator, self._spent = self._pipe, None, None, False
        shutdown = getattr(pipe, "_shutdown", None)  # private in DALI 2.4 (pinned <2.5); without it: the collector
        if shutdown is None:
            return
        if self.device.type == "cuda":  # the last batch's copy out of the pipeline's buffers may still be queued
            torch.cuda.current_stream(self.device).synchronize()
        try:
            shutdown()
        except Exception as e:  # noqa: BLE001 - freeing a pipeline early must not replace the error being handled
            log.warning("DALI pipeline shutdown: %s", e)

    def _decode_error(self, done: int, e: RuntimeError) -> UserError:
        """A one-line error naming the file(s) DALI could not decode: the one its message names, or
        those PIL (else DALI's CPU decoder, one by one) cannot decode among the failed batch and the
        ones DALI had prefetched with it.
        With neither, the failure is not a file's (memory, say): DALI's reason, no file blamed."""
        from PIL import Image

        if self.train:
            mine = self._order().rank_block(self.dist.rank, self.dist.world_size)
        else:
            mine = contiguous_shard(len(self.split), self.dist.rank, self.dist.world_size)
        ahead = self.settings.prefetch_queue_depth + 1
        candidates = [self.split.files[i] for i in mine[done * self.batch_size : (done + ahead) * self.batch_size]]
        text = str(e)
        bad = [path for path in candidates if path in text]  # "Failed to decode sample #N : PATH"
        for path in [] if bad else candidates:
            try:
                with Image.open(path) as im:
                    im.load()
            except Exception:  # noqa: BLE001 - any failure marks the file
                bad.append(path)
        bad = bad or dali_cannot_decode(candidates)  # files PIL reads and DALI does not (a 1-bit TIFF)
        where = f"epoch {self.epoch}, batch {self.start_step + done}" if self.train else f"validation batch {done}"
        if not bad:
            return UserError(
                f"DALI's {'train' if self.train else 'val'} pipeline failed ({where}) on no file that fails to "
                f"decode among the {len(candidates)} it was reading: {dali_reason(e)}"
            )
        what = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        return DatasetError(f"DALI could not decode {what} ({where}); {EXCLUDE_HINT}")


def dali_cannot_decode(paths: list[str]) -> list[str]:
    """Those of `paths` that DALI's CPU decoder fails on, one at a time (an error path: seconds for
    the few hundred files of a failed batch and its prefetched ones)."""
    bad, pipe = [], None
    for path in paths:
        pipe = pipe or decode_one_pipeline()
        pipe.feed_input("encoded", [np.fromfile(path, dtype=np.uint8)])
        try:
            pipe.run()
        except RuntimeError:
            bad.append(path)
            pipe = None
    return bad


def dali_reason(e: RuntimeError) -> str:
    """The line of a DALI error that says what went wrong ("Assert on ... failed: ...", or what
    follows "encountered:" with the operator named), not its first line, which is only "Critical
    error when building pipeline:"."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if "encountered:" in lines[:-1]:
        operator = next((line.rstrip(",") for line in lines if line.startswith("Error in ")), "")
        reason = lines[lines.index("encountered:") + 1]
        return f"{operator}: {reason}" if operator else reason
    for line in lines:
        if "Assert on" in line or line.startswith("Invalid") or "rror:" in line:
            return line
    return lines[0] if lines else type(e).__name__


def _is_pipeline_error(e: RuntimeError) -> bool:
    """DALI reports an operator failure (a file it cannot read or decode) as a RuntimeError
    "Critical error in pipeline: ..."; other RuntimeErrors are bugs and keep their traceback."""
    return "pipeline" in str(e)
