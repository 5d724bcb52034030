"""Hugging Face Transformers for real (CPU, a tiny GPT-2 built from a config, no download, a few steps) with
StartlineCallback: the first step, three checkpoint saves (save_steps=2) and the end reach the node agent.

usage: e2e_transformers.py WORKDIR"""

import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import startline
from startline.integrations.transformers import StartlineCallback


class Tokens(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 32, (24, 8), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    work = sys.argv[1]
    config = GPT2Config(vocab_size=32, n_positions=8, n_embd=8, n_layer=1, n_head=1)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir=f"{work}/out",
        max_steps=6,
        per_device_train_batch_size=4,
        save_steps=2,
        save_strategy="steps",
        logging_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[StartlineCallback()]).train()
    assert startline.flush(20), startline.get_reporter().stats()
    print(startline.get_reporter().stats())


if __name__ == "__main__":
    main()
