"""A two-layer GPT-2 built from a config (no download): dict batches, default loss model(**batch).loss."""
import torch
from torch.utils.data import Dataset

ITEM_NAME = "tokens"
BASELINE = {"batch_size": 4}


class Tokens(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


def build_model():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16, bos_token_id=0,
                        eos_token_id=0)
    return GPT2LMHeadModel(config)


def build_dataset():
    return Tokens()


def count_items(batch):
    return int(batch["input_ids"].numel())
