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
