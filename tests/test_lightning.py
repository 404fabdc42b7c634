"""The README's Lightning recipe under a real lightning.Trainer: a run resumed from a checkpoint
taken mid-epoch (in epoch 0 and in epoch 1) trains on exactly the batches the uninterrupted run
trained on, none repeated and none skipped (issue 26, item 1: Lightning makes the epoch's iterator
before on_train_epoch_start, where the recipe calls set_epoch)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import fastload as fl

pl = pytest.importorskip("lightning.pytorch")

N, BATCH, EPOCHS = 96, 8, 2
STEPS_PER_EPOCH = N // BATCH


class Recipe(pl.LightningModule):
    """The README's recipe: the Loader from train_dataloader(), set_epoch in on_train_epoch_start."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[np.ndarray] = []
        self.loader = fl.Loader(fl.Dataset({"x": np.arange(N, dtype=np.float32)}), batch_size=BATCH, shuffle=True,
                                seed=11, with_index=True, num_threads=2)

    def train_dataloader(self):
        return self.loader

    def on_train_epoch_start(self):
        self.loader.set_epoch(self.current_epoch)

    def training_step(self, batch, batch_idx):
        self.seen.append(batch["index"].numpy().copy())
        return self.layer(batch["x"][:, None]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def fit(tmp_path, ckpt_path=None, save=False):
    callbacks = []
    if save:
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=tmp_path, filename="{step}", every_n_train_steps=1,
                                                      save_top_k=-1))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=EPOCHS, use_distributed_sampler=False,
                         enable_progress_bar=False, enable_model_summary=False, logger=False, callbacks=callbacks,
                         num_sanity_val_steps=0, enable_checkpointing=save)
    module = Recipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's own advice (workers, logging) is not under test
        trainer.fit(module, ckpt_path=ckpt_path)
    module.loader.close()
    return module.seen


@pytest.mark.slow  # two Trainer runs each, about 5 s
@pytest.mark.parametrize("step", [5, STEPS_PER_EPOCH + 5])  # mid-epoch 0, mid-epoch 1
def test_lightning_resumes_mid_epoch_without_repeating_or_skipping(tmp_path, step):
    full = fit(tmp_path, save=True)
    assert len(full) == EPOCHS * STEPS_PER_EPOCH
    per_epoch = [np.sort(np.concatenate(full[e * STEPS_PER_EPOCH:(e + 1) * STEPS_PER_EPOCH])) for e in range(EPOCHS)]
    assert all(np.array_equal(p, np.arange(N)) for p in per_epoch)  # each epoch is every sample once
    resumed = fit(tmp_path, ckpt_path=str(tmp_path / f"step={step}.ckpt"))
    assert len(resumed) == len(full) - step
    for a, b in zip(full[:step] + resumed, full, strict=True):
        assert np.array_equal(a, b)


def _page_blocks() -> list[str]:
    import pathlib
    import re

    page = pathlib.Path(__file__).parent.parent / "docs" / "lightning.md"
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.S)


@pytest.mark.slow  # three Trainer runs, about 10 s
def test_the_lightning_page_runs_as_written_and_resumes_at_the_next_batch(tmp_path, monkeypatch):
    """docs/lightning.md's example, run as written (its __main__ part too), then again with each
    batch's sample ids recorded: the run resumed from the checkpoint at step 20 trains on the
    uninterrupted run's batches from the 21st on."""
    (block,) = _page_blocks()
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's own advice (workers, logging) is not under test
        exec(compile(block, "docs/lightning.md", "exec"), {"__name__": "__main__"})
        assert (tmp_path / "checkpoints" / "step=20.ckpt").exists()
        scope: dict = {"__name__": "lightning_page"}
        exec(compile(block, "docs/lightning.md", "exec"), scope)
        seen: list[np.ndarray] = []

        class Recording(scope["Model"]):
            def training_step(self, batch, batch_idx):
                seen.append(batch["index"].numpy().copy())
                return super().training_step(batch, batch_idx)

        scope["trainer"](enable_checkpointing=False).fit(Recording())
        full, seen[:] = list(seen), []
        scope["trainer"](enable_checkpointing=False).fit(Recording(), ckpt_path="checkpoints/step=20.ckpt")
    assert len(full) == 2 * 16 and len(seen) == len(full) - 20
    for a, b in zip(seen, full[20:], strict=True):
        np.testing.assert_array_equal(a, b)
    for epoch in range(2):
        np.testing.assert_array_equal(np.sort(np.concatenate(full[epoch * 16:(epoch + 1) * 16])), np.arange(512))
