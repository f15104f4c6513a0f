"""A Hugging Face Trainer handed over as it is (build_trainer()), small enough for a test: a one-layer GPT-2 from a
config on token records that each take 8 ms to read, read in the training process (dataloader_num_workers=0), with
gradient accumulation. The wait dominates each step by far, so loader workers win clearly even on a busy machine
(a sleeping read needs no CPU)."""
import os
import tempfile
import time

import torch
from torch.utils.data import Dataset

SEQ_LEN = 16
VOCAB = 64
READ_LATENCY_S = 0.008
SEARCH = {"num_workers": [0, 2]}  # one rung: the test checks the path, not the ladder


class SlowTokens(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, idx):
        time.sleep(READ_LATENCY_S)
        ids = torch.randint(3, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(idx))
        return {"input_ids": ids, "attention_mask": torch.ones(SEQ_LEN, dtype=torch.long), "labels": ids.clone()}


def build_trainer():
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, default_data_collator

    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ_LEN, use_cache=False,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    args = TrainingArguments(output_dir=os.path.join(tempfile.gettempdir(), "tiny_trainer_test"),
                             per_device_train_batch_size=8, gradient_accumulation_steps=4,
                             dataloader_num_workers=0, learning_rate=3e-4, report_to="none")
    return Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=SlowTokens(),
                   data_collator=default_data_collator)
