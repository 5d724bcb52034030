"""Plain PyTorch with startline: data staging, the first step, timed checkpoint saves and the end.

Run it inside a job (the job id and the transport come from the environment: docs/training-process.md), e.g.
``STARTLINE_JOB_ID=slurm/c1/42 python pytorch_loop.py /tmp/work``.
"""

import os
import sys

import torch

import startline


def main() -> None:
    work = sys.argv[1] if len(sys.argv) > 1 else "."
    startline.preparing("data_staging")
    torch.manual_seed(0)
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    startline.preparing("environment")
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        for step in range(1, 7):
            i = (step - 1) * 8 % 64
            loss = torch.nn.functional.mse_loss(model(x[i : i + 8]), y[i : i + 8])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step == 1:
                startline.first_step(step)
            if step % 2 == 0:
                path = os.path.join(work, f"ckpt-{step}.pt")
                with startline.saving_checkpoint(step, uri=f"file://{os.path.abspath(path)}"):
                    torch.save({"model": model.state_dict(), "step": step}, path)
    except BaseException as e:
        startline.done("failed", message=f"{type(e).__name__}: {e}")
        raise
    startline.done("succeeded", exit_code=0)
    startline.flush(20)


if __name__ == "__main__":
    main()
