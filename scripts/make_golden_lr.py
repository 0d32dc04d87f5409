#!/usr/bin/python3
"""Writes tests/data/golden/lr_schedules.txt: the learning rates that
torch.optim.lr_scheduler (torch 1.13.1, Debian 12's python3-torch) gives for
each case below, after construction and after each step, for two parameter
groups (lr 0.1 and 0.05). tests/test_lr_scheduler.cpp builds the same cases
with shardopt::lr_scheduler and compares every value bit for bit.

    apt-get install python3-torch
    /usr/bin/python3 scripts/make_golden_lr.py

Format: for each case a line "case NAME STEPS", then STEPS + 1 lines of the
groups' learning rates (Python's repr: the shortest text that reads back as
the same double), the first after construction.
"""

import math
import os
import sys

import torch
from torch.optim import lr_scheduler as S

STEPS = 40
LRS = (0.1, 0.05)


def optimizer():
    w = [torch.nn.Parameter(torch.zeros(1)) for _ in LRS]
    return torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(w, LRS)], lr=LRS[0])


# name: a function of the optimizer giving the schedule. The C++ test makes
# the same schedule for each name.
CASES = {
    "step": lambda o: S.StepLR(o, step_size=3, gamma=0.5),
    "multistep": lambda o: S.MultiStepLR(o, milestones=[9, 2, 5, 5], gamma=0.3),
    "constant": lambda o: S.ConstantLR(o, factor=0.25, total_iters=4),
    "linear_warmup": lambda o: S.LinearLR(o, start_factor=0.1, end_factor=1.0, total_iters=10),
    "linear_decay": lambda o: S.LinearLR(o, start_factor=1.0, end_factor=0.05, total_iters=30),
    "exponential": lambda o: S.ExponentialLR(o, gamma=0.93),
    "cosine": lambda o: S.CosineAnnealingLR(o, T_max=10, eta_min=0.001),
    "cosine_restarts": lambda o: S.CosineAnnealingWarmRestarts(o, T_0=4, T_mult=2, eta_min=1e-4),
    "cosine_restarts_even": lambda o: S.CosineAnnealingWarmRestarts(o, T_0=7),
    "polynomial": lambda o: S.PolynomialLR(o, total_iters=12, power=2.0),
    "onecycle": lambda o: S.OneCycleLR(o, max_lr=[0.5, 0.2], total_steps=STEPS,
                                       cycle_momentum=False),
    "onecycle_linear_3": lambda o: S.OneCycleLR(o, max_lr=0.3, total_steps=STEPS, pct_start=0.25,
                                                anneal_strategy="linear", three_phase=True,
                                                cycle_momentum=False),
    "lambda": lambda o: S.LambdaLR(o, lr_lambda=[lambda e: 0.95 ** e, lambda e: 1.0 / (1 + e)]),
    "multiplicative": lambda o: S.MultiplicativeLR(o, lr_lambda=lambda e: 0.9),
    "chained": lambda o: S.ChainedScheduler([S.ConstantLR(o, factor=0.5, total_iters=3),
                                             S.ExponentialLR(o, gamma=0.9)]),
    "sequential_warmup_cosine": lambda o: S.SequentialLR(
        o, [S.LinearLR(o, start_factor=0.1, total_iters=5), S.CosineAnnealingLR(o, T_max=20)],
        milestones=[5]),
    "sequential_three": lambda o: S.SequentialLR(
        o, [S.ConstantLR(o, factor=0.5, total_iters=3), S.ExponentialLR(o, gamma=0.9),
            S.StepLR(o, step_size=2, gamma=0.5)], milestones=[4, 9]),
}


def main():
    if not torch.__version__.startswith("1.13."):
        sys.exit("make_golden_lr.py: torch %s; the golden data are torch 1.13's (Debian 12)"
                 % torch.__version__)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data",
                       "golden", "lr_schedules.txt")
    lines = ["# torch %s torch.optim.lr_scheduler, groups lr %s: scripts/make_golden_lr.py"
             % (torch.__version__, ", ".join(map(repr, LRS)))]
    for name, make in CASES.items():
        o = optimizer()
        s = make(o)
        lines.append("case %s %d" % (name, STEPS))
        for k in range(STEPS + 1):
            if k > 0:
                o.step()
                s.step()
            lines.append(" ".join(repr(g["lr"]) for g in o.param_groups))
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %s: %d cases of %d steps" % (os.path.normpath(out), len(CASES), STEPS))


if __name__ == "__main__":
    main()
