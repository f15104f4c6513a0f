"""A LightningModule with manual optimization and two optimizers, as a GAN is written: `automatic_optimization =
False`, `self.optimizers()`, `self.manual_backward`, a generator and a discriminator stepped in turn. It trains only
under a real lightning.Trainer (its training_step calls the Trainer's optimizers), small enough for a test."""
import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

LATENT, FEATURES = 8, 16
SEARCH = {"batch_size": [32, 64]}
TRAINER_ARGS = {"precision": "32-true", "max_epochs": 5, "enable_progress_bar": False}


class TinyGAN(L.LightningModule):
    def __init__(self, batch_size=32):
        super().__init__()
        self.automatic_optimization = False
        self.batch_size = batch_size
        self.generator = nn.Sequential(nn.Linear(LATENT, 32), nn.ReLU(), nn.Linear(32, FEATURES))
        self.discriminator = nn.Sequential(nn.Linear(FEATURES, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        (real,) = batch
        g_opt, d_opt = self.optimizers()
        noise = torch.randn(real.shape[0], LATENT, device=real.device)
        fake = self.generator(noise)
        ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)

        d_loss = (F.binary_cross_entropy_with_logits(self.discriminator(real), ones)
                  + F.binary_cross_entropy_with_logits(self.discriminator(fake.detach()), zeros))
        d_opt.zero_grad()
        self.manual_backward(d_loss)
        d_opt.step()

        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(fake), ones)
        g_opt.zero_grad()
        self.manual_backward(g_loss)
        g_opt.step()
        self.log_dict({"d_loss": d_loss, "g_loss": g_loss})
        return g_loss

    def configure_optimizers(self):
        return (torch.optim.Adam(self.generator.parameters(), lr=2e-4),
                torch.optim.Adam(self.discriminator.parameters(), lr=2e-4))

    def train_dataloader(self):
        data = torch.randn(2048, FEATURES, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(data), batch_size=self.batch_size, shuffle=True)


def build_module():
    return TinyGAN()
