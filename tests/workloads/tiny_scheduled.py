"""A LightningModule that leans on its Trainer: `self.trainer` (the estimated step count sizes its schedule),
`self.current_epoch` and `self.global_step` in training_step, and a OneCycle learning-rate schedule stepped every
step (`"interval": "step"`). It trains only under a real lightning.Trainer, small enough for a test."""
import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SEARCH = {"batch_size": [32, 64]}
TRAINER_ARGS = {"precision": "32-true", "max_steps": 400, "accumulate_grad_batches": 2, "gradient_clip_val": 1.0,
                "enable_progress_bar": False}


class Scheduled(L.LightningModule):
    def __init__(self, batch_size=32):
        super().__init__()
        self.batch_size = batch_size
        self.net = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        # a warm start on the first epoch, as curriculum code does: reads the Trainer's own counters
        scale = 0.5 if self.current_epoch == 0 and self.global_step < 10 else 1.0
        loss = F.cross_entropy(self.net(x * scale), y)
        self.log("train_loss", loss, prog_bar=True)
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        total = self.trainer.estimated_stepping_batches  # needs the Trainer attached
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=max(int(total), 1) + 10)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(1024, 24, generator=g), torch.randint(4, (1024,), generator=g)),
                          batch_size=self.batch_size, shuffle=True)


def build_module():
    return Scheduled()
