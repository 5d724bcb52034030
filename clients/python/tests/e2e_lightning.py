"""PyTorch Lightning for real (CPU, a model of a few parameters, a few steps) with StartlineCallback: the first
step, three checkpoint saves (ModelCheckpoint every 2 steps) and the end reach the node agent.

With FAIL as a second argument the third step raises: the callback reports done: failed and the exception
still reaches the caller.

usage: e2e_lightning.py WORKDIR [FAIL]"""

import sys

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

import startline
from startline.integrations.lightning import StartlineCallback


class Tiny(pl.LightningModule):
    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.fail = fail

    def training_step(self, batch, batch_idx):
        if self.fail and self.global_step == 2:
            raise RuntimeError("loss is nan")
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    work = sys.argv[1]
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(24, 4), torch.randn(24, 1))
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=f"{work}/ckpt", every_n_train_steps=2, save_top_k=-1)
    trainer = pl.Trainer(
        max_steps=6,
        accelerator="cpu",
        devices=1,
        callbacks=[StartlineCallback(), ckpt],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=work,
    )
    fail = len(sys.argv) > 2 and sys.argv[2] == "FAIL"
    try:
        trainer.fit(Tiny(fail), DataLoader(data, batch_size=4))
        assert not fail, "the failure reached the caller"
    except RuntimeError as e:
        assert fail and "loss is nan" in str(e), e
    assert startline.flush(20), startline.get_reporter().stats()
    print(startline.get_reporter().stats())


if __name__ == "__main__":
    main()
