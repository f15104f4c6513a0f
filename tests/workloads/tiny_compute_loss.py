"""A transformers.Trainer subclass with its own compute_loss (label smoothing written by hand), a dynamic-padding
collator (each batch padded to its longest record) and a cosine schedule, small enough for a test."""
import os
import tempfile

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

VOCAB = 64
SEARCH = {"batch_size": [8, 16]}


class VarLenTokens(Dataset):
    def __len__(self):
        return 512

    def __getitem__(self, idx):
        g = torch.Generator().manual_seed(idx)
        n = int(torch.randint(6, 24, (1,), generator=g))
        return {"input_ids": torch.randint(3, VOCAB, (n,), generator=g)}


def pad_to_longest(records):
    longest = max(len(r["input_ids"]) for r in records)
    ids = torch.zeros(len(records), longest, dtype=torch.long)
    mask = torch.zeros(len(records), longest, dtype=torch.long)
    for i, r in enumerate(records):
        ids[i, :len(r["input_ids"])] = r["input_ids"]
        mask[i, :len(r["input_ids"])] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def build_trainer():
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    class SmoothedTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            labels = inputs.pop("labels")
            outputs = model(**inputs)
            logits = outputs.logits[:, :-1].reshape(-1, VOCAB)
            loss = F.cross_entropy(logits, labels[:, 1:].reshape(-1), ignore_index=-100, label_smoothing=0.1)
            return (loss, outputs) if return_outputs else loss

    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32, use_cache=False,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    args = TrainingArguments(output_dir=os.path.join(tempfile.gettempdir(), "tiny_compute_loss_test"),
                             per_device_train_batch_size=8, gradient_accumulation_steps=2, learning_rate=3e-4,
                             lr_scheduler_type="cosine", warmup_steps=5, num_train_epochs=1, logging_steps=5,
                             remove_unused_columns=False, report_to="none", disable_tqdm=True)
    return SmoothedTrainer(model=GPT2LMHeadModel(config), args=args, train_dataset=VarLenTokens(),
                           data_collator=pad_to_longest)
