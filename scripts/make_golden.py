#!/usr/bin/env python3
"""Golden optimizer trajectories from PyTorch, for shardopt's optimizer tests.

Writes tests/data/golden/<optimizer>.bin (format: tests/data/golden/README.md):
for every case, the parameters after each of `steps` optimizer steps, computed
by torch.optim (SGD, Adam, AdamW, Adagrad, RMSprop), by torch's float32
operations as torch 2 orders them (NAdam, RAdam: torch 1.13's classes differ,
see below), or, for the optimizers that torch lacks (Lion, LAMB), by the
float64 implementations below.
The inputs are not stored: initial parameters and gradients come from a
counter-based generator (splitmix64) that tests/golden.hpp reproduces bit for
bit, so a C++ test regenerates them and compares shardopt's parameters with
the recorded ones step by step.

The files are committed; shardopt's build and tests never need PyTorch. To
regenerate them (Debian 12: `apt-get install python3-torch`, torch 1.13.1,
CPU), from the repository root:

    /usr/bin/python3 scripts/make_golden.py      # writes tests/data/golden/, ~2 s

torch runs on one thread, so the files do not depend on the machine's core
count. They were made with torch's AVX2 CPU kernels, and the tests compare
shardopt with the torch files (SGD, Adam, AdamW, Adagrad, RMSprop, NAdam, RAdam) bitwise,
at every step: no tolerance absorbs a difference. Only Lion and LAMB, made
here in float64, which no vector unit changes, are compared within 2e-6.
torch picks its CPU kernels at run time: its default kernels (CPUs without
AVX2) round the product and the sum of `add_(alpha=)` and `addcmul_`
separately where the AVX2 ones fuse them (tests/data/golden/README.md), so a
file regenerated there differs in the last bits of many values (up to about
1e-6 after 20 steps) and the bitwise tests fail on it. Whether torch's
AVX-512 kernels give the AVX2 ones' bits has not been checked. On another
CPU, regenerate with ATEN_CPU_CAPABILITY=avx2 (torch's AVX2 kernels, where
the CPU has AVX2), and before committing check with `git status` that the
files of the optimizers whose cases did not change came out unchanged.

It also re-implements torch's formulas in float64 (the per-element updates of
torch 1.13's single-tensor code paths, in the same order) and prints, per
optimizer, the largest difference between torch's float32 trajectory and the
float64 one: a check that the formulas written here (and in the README), which
shardopt's kernels follow, are the ones torch computes. Nothing of it is
stored.
"""

import argparse
import itertools
import math
import os
import struct
import sys
import time
import zlib

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_options import OPTIONS, SELECTED  # noqa: E402

FORMAT_MAGIC = b"SHOPTGLD"  # 8 bytes
FORMAT_VERSION = 1

STEPS = 20
SIZES_SMALL = (1, 7)  # every option combination
SIZE_MID = 1000  # selected combinations
SIZE_BIG = 65537  # a few combinations, sampled
SAMPLE_COUNT = 1024  # indices recorded at every step for SIZE_BIG

M64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15

# ------------------------------------------------------------------ inputs


def splitmix64_int(x):
    """splitmix64 of one Python int, with uint64 wrapping."""
    x = (x + GOLDEN_GAMMA) & M64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def splitmix64_np(x):
    """splitmix64 of a uint64 array (numpy's uint64 array arithmetic wraps)."""
    x = x + np.uint64(GOLDEN_GAMMA)
    z = x
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def value(seed, stream, n):
    """value(seed, stream, i) for i = 0..n-1: float32 in [-1, 1), exact."""
    key = splitmix64_int((seed + stream * GOLDEN_GAMMA) & M64)
    u = splitmix64_np(np.uint64(key) + np.arange(n, dtype=np.uint64))
    top = (u >> np.uint64(40)).astype(np.float64)  # 24 bits
    return (top * 2.0**-23 - 1.0).astype(np.float32)


def round_grad(g, precision):
    """The gradient as the optimizer receives it: rounded through bf16/fp16."""
    if precision == "f32":
        return g
    dtype = {"bf16grad": torch.bfloat16, "f16grad": torch.float16}[precision]
    return torch.from_numpy(g).to(dtype).to(torch.float32).numpy()


def inputs(seed, n, steps, grad_scale, precision):
    """(p0, [g_1..g_steps]) as float32 arrays, the grads as the optimizer sees them."""
    p0 = value(seed, 0, n)
    grads = [
        round_grad(value(seed, s, n) * np.float32(grad_scale), precision)
        for s in range(1, steps + 1)
    ]
    return p0, grads


def big_sample(n):
    """SAMPLE_COUNT sorted indices of an n-element tensor: the ends, the
    elements around multiples of 8, 16 and 64 (SIMD block edges), then a fixed
    pseudo-random spread."""
    picked = set(range(4)) | set(range(n - 8, n))
    for block in (8, 16, 64):
        for k in list(range(block, 16 * block + 1, block)) + [n - n % block]:
            picked.update(i for i in (k - 1, k, k + 1) if 0 <= i < n)
    for m in (256, 1024, 4096, 32768, 65536):
        picked.update(i for i in (m - 1, m, m + 1) if 0 <= i < n)
    x = 0x5A4D504C45  # fixed: the sample must not change between runs
    while len(picked) < SAMPLE_COUNT:
        x = splitmix64_int(x)
        picked.add(x % n)
    assert len(picked) == SAMPLE_COUNT
    return np.array(sorted(picked), dtype=np.uint32)


# --------------------------------------------------------------- optimizers
#
# The options of every optimizer, their defaults and the values the cases
# switch to: scripts/golden_options.py.

TORCH_CLASS = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "adagrad": torch.optim.Adagrad,
    "rmsprop": torch.optim.RMSprop,
}


def defaults(opt):
    return {k: (v if k == "lr" else v[0]) for k, v in OPTIONS[opt].items()}


def full_options(opt, changes):
    """Every option of `opt`: the defaults (lr: the case lr) with `changes`;
    a change given as True means "the non-default value"."""
    o = defaults(opt)
    for k, v in changes.items():
        o[k] = OPTIONS[opt][k][1] if v is True else v
    return o


def valid(opt, o):
    """False for combinations torch refuses or that repeat another's math."""
    if opt == "sgd":
        if o["momentum"] == 0 and (o["dampening"] != 0 or o["nesterov"]):
            return False  # dampening is unused; nesterov is an error
        if o["nesterov"] and o["dampening"] != 0:
            return False  # an error in torch
    if o.get("decoupled_weight_decay") and o["weight_decay"] == 0:
        return False  # no decay to decouple
    return True


def torch_kwargs(opt, o):
    kw = {}
    for k, v in o.items():
        if k in ("beta1", "beta2"):
            continue
        if k in ("nesterov", "maximize", "amsgrad", "centered", "decoupled_weight_decay"):
            v = bool(v)
        kw[k] = v
    if "beta1" in o:
        kw["betas"] = (o["beta1"], o["beta2"])
    return kw


def fmt(v):
    return repr(int(v)) if float(v).is_integer() else repr(v)


class Case:
    def __init__(self, opt, options, precision="f32", grad_scale=1.0):
        self.opt = opt
        self.options = options
        self.precision = precision
        self.grad_scale = grad_scale

    def key(self):
        return (self.opt, tuple(sorted(self.options.items())), self.precision, self.grad_scale)

    def name(self, n):
        base = defaults(self.opt)
        parts = [self.opt]
        for k, v in self.options.items():
            if k == "lr" or v != base[k]:
                parts.append(f"{k}={fmt(v)}")
        if self.precision != "f32":
            parts.append("grad=" + self.precision[:-4])
        if self.grad_scale != 1.0:
            parts.append(f"grad_scale=2^{int(math.log2(self.grad_scale))}")
        parts.append(f"n={n}")
        return " ".join(parts)

    def seed(self, n):
        # From the name, so adding a case does not change the others' inputs.
        return (zlib.crc32(self.name(n).encode()) << 20) + n


def case_list(opt):
    """[(Case, sizes)] of one optimizer file, in file order."""
    toggles = [k for k in OPTIONS[opt] if k != "lr"]
    out, seen = [], {}

    def add(case, sizes):
        k = case.key()
        if k in seen:
            seen[k].extend(s for s in sizes if s not in seen[k])
        else:
            seen[k] = list(sizes)
            out.append(case)

    T = True
    # Every combination of defaults and non-defaults, at the small sizes.
    for bits in itertools.product((False, True), repeat=len(toggles)):
        o = full_options(opt, {k: T for k, b in zip(toggles, bits) if b})
        if valid(opt, o):
            add(Case(opt, o), SIZES_SMALL)
    # The selected combinations, at n = 1000 (and some at 65537).
    for changes, big in SELECTED[opt]:
        add(Case(opt, full_options(opt, changes)),
            SIZES_SMALL + ((SIZE_MID, SIZE_BIG) if big else (SIZE_MID,)))

    # eps is felt only where sqrt(v) is as small as eps: small gradients.
    if opt in ("adam", "adamw"):
        add(Case(opt, full_options(opt, {"eps": 1e-4}), grad_scale=2.0**-10),
            SIZES_SMALL + (SIZE_MID,))

    # Mixed precision: bf16/fp16 gradients, fp32 master weights and states.
    for prec in ("bf16grad", "f16grad"):
        if opt in ("nadam", "radam"):
            add(Case(opt, full_options(opt, {}), prec), SIZES_SMALL + (SIZE_MID,))
            add(Case(opt, full_options(opt, {"weight_decay": T}), prec), SIZES_SMALL)
        elif opt in ("adam", "adamw"):
            add(Case(opt, full_options(opt, {}), prec), SIZES_SMALL + (SIZE_MID,))
            add(Case(opt, full_options(opt, {"weight_decay": T, "amsgrad": T}), prec),
                SIZES_SMALL + ((SIZE_MID, SIZE_BIG) if opt == "adamw" and prec == "bf16grad"
                               else (SIZE_MID,)))
        else:
            add(Case(opt, full_options(opt, {}), prec), SIZES_SMALL)
    if opt == "adam":
        # fp16 subnormals: |g| < 2^-14 for a quarter of the elements.
        add(Case(opt, full_options(opt, {}), "f16grad", grad_scale=2.0**-12),
            SIZES_SMALL + (SIZE_MID,))
    return [(c, sorted(seen[c.key()])) for c in out]


# ------------------------------------------------------------ trajectories


def run_torch(opt, o, p0, grads):
    """torch.optim on one fp32 tensor; [(steps+1) x n] float32, row 0 = p0."""
    if opt in TORCH_OPS:
        return TORCH_OPS[opt](o, p0, grads)
    p = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    optimizer = TORCH_CLASS[opt]([p], **torch_kwargs(opt, o))
    rows = [p0.copy()]
    for g in grads:
        p.grad = torch.from_numpy(g.copy())
        optimizer.step()
        rows.append(p.detach().numpy().copy())
    return np.stack(rows)


# NAdam and RAdam: torch's single-tensor steps written out in torch's own
# float32 tensor operations, as torch 2 performs them: the options torch 1.13
# lacks (decoupled_weight_decay, maximize) and NAdam's next momentum product,
# mu_product * mu_next (torch 1.13 multiplies mu in twice there, a bug torch
# 2.0 fixed). The moments are updated as torch 1.13 does (mul_ then add_), as
# for shardopt's Adam; torch 2 uses lerp_ for the first moment. Each is
# checked against torch 1.13's own class, bitwise, on the cases the class can
# run (torch_nadam with bug113=True reproduces torch 1.13's NAdam).


def torch_adam_like(o, p0, grads, update):
    """The part NAdam and RAdam share: maximize, the weight decay (coupled or
    decoupled), the moments m and v; update(p, grad, m, v, step) then moves p
    in place (step: torch's float32 step count, as a float)."""
    lr, b1, b2, wd = o["lr"], o["beta1"], o["beta2"], o["weight_decay"]
    p = torch.from_numpy(p0.copy())
    m = torch.zeros_like(p)
    v = torch.zeros_like(p)
    rows = [p0.copy()]
    for step, g in enumerate(grads, 1):
        grad = torch.from_numpy(g.copy())
        if o["maximize"]:
            grad = -grad
        step_f = float(torch.tensor(float(step)).item())
        if wd != 0:
            if o["decoupled_weight_decay"]:
                p.mul_(1 - lr * wd)
            else:
                grad = grad.add(p, alpha=wd)
        m.mul_(b1).add_(grad, alpha=1 - b1)
        v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        update(p, grad, m, v, step_f)
        rows.append(p.numpy().copy())
    return np.stack(rows)


def torch_nadam(o, p0, grads, bug113=False):
    lr, b1, b2, eps, md = o["lr"], o["beta1"], o["beta2"], o["eps"], o["momentum_decay"]
    mu_product = torch.tensor(1.0)  # float32, as torch's state["mu_product"]

    def update(p, grad, m, v, step_f):
        nonlocal mu_product
        bias_correction2 = 1 - b2 ** step_f
        mu = b1 * (1.0 - 0.5 * (0.96 ** (step_f * md)))
        mu_next = b1 * (1.0 - 0.5 * (0.96 ** ((step_f + 1) * md)))
        mu_product *= mu
        if bug113:
            mu_product_next = (mu_product * mu * mu_next).item()
        else:
            mu_product_next = mu_product.item() * mu_next
        denom = v.div(bias_correction2).sqrt().add_(eps)
        p.addcdiv_(grad, denom, value=(-lr * (1.0 - mu) / (1.0 - mu_product.item())))
        p.addcdiv_(m, denom, value=(-lr * mu_next) / (1.0 - mu_product_next))

    return torch_adam_like(o, p0, grads, update)


def torch_radam(o, p0, grads):
    lr, b1, b2, eps = o["lr"], o["beta1"], o["beta2"], o["eps"]

    def update(p, grad, m, v, step_f):
        bias_correction1 = 1 - b1 ** step_f
        bias_correction2 = 1 - b2 ** step_f
        bias_corrected_exp_avg = m / bias_correction1
        rho_inf = 2 / (1 - b2) - 1
        rho_t = rho_inf - 2 * step_f * (b2 ** step_f) / bias_correction2
        if rho_t > 5.0:
            rect = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf
                             / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
            adaptive_lr = math.sqrt(bias_correction2) / v.sqrt().add_(eps)
            p.add_(bias_corrected_exp_avg * lr * adaptive_lr * rect, alpha=-1.0)
        else:
            p.add_(bias_corrected_exp_avg * lr, alpha=-1.0)

    return torch_adam_like(o, p0, grads, update)


TORCH_OPS = {"nadam": torch_nadam, "radam": torch_radam}


def check_torch_ops(opt, o, p0, grads):
    """The op-by-op step against torch 1.13's class, bitwise, where the class
    can run the case."""
    if o["maximize"] or o["decoupled_weight_decay"]:
        return
    kw = {k: v for k, v in torch_kwargs(opt, o).items()
          if k not in ("maximize", "decoupled_weight_decay")}
    p = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    optimizer = {"nadam": torch.optim.NAdam, "radam": torch.optim.RAdam}[opt]([p], **kw)
    rows = [p0.copy()]
    for g in grads:
        p.grad = torch.from_numpy(g.copy())
        optimizer.step()
        rows.append(p.detach().numpy().copy())
    mine = torch_nadam(o, p0, grads, bug113=True) if opt == "nadam" else torch_radam(o, p0, grads)
    if not np.array_equal(np.stack(rows).view(np.uint32), mine.view(np.uint32)):
        sys.exit(f"{opt} {o}: the op-by-op step differs from torch.optim's")


def ref_sgd(o, p, grads):
    lr, mom, damp, wd = o["lr"], o["momentum"], o["dampening"], o["weight_decay"]
    buf = None
    for g in grads:
        d = -g if o["maximize"] else g
        if wd != 0:
            d = d + wd * p
        if mom != 0:
            buf = d.copy() if buf is None else mom * buf + (1 - damp) * d
            d = d + mom * buf if o["nesterov"] else buf
        p = p - lr * d
        yield p


def ref_adam(o, p, grads, decoupled):
    lr, b1, b2, eps, wd = o["lr"], o["beta1"], o["beta2"], o["eps"], o["weight_decay"]
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    vmax = np.zeros_like(p)
    for t, g in enumerate(grads, 1):
        g = -g if o["maximize"] else g
        if decoupled:
            p = p * (1 - lr * wd)
        elif wd != 0:
            g = g + wd * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        bc1 = 1 - b1**t
        bc2 = 1 - b2**t
        if o["amsgrad"]:
            vmax = np.maximum(vmax, v)
            denom = np.sqrt(vmax) / math.sqrt(bc2) + eps
        else:
            denom = np.sqrt(v) / math.sqrt(bc2) + eps
        p = p - (lr / bc1) * m / denom
        yield p


def ref_adagrad(o, p, grads):
    lr, wd, eps = o["lr"], o["weight_decay"], o["eps"]
    s = np.full_like(p, np.float64(np.float32(o["initial_accumulator_value"])))
    for t, g in enumerate(grads, 1):
        g = -g if o["maximize"] else g
        if wd != 0:
            g = g + wd * p
        clr = lr / (1 + (t - 1) * o["lr_decay"])
        s = s + g * g
        p = p - clr * g / (np.sqrt(s) + eps)
        yield p


def ref_rmsprop(o, p, grads):
    lr, alpha, eps, wd, mom = o["lr"], o["alpha"], o["eps"], o["weight_decay"], o["momentum"]
    sq = np.zeros_like(p)
    gavg = np.zeros_like(p)
    buf = np.zeros_like(p)
    for g in grads:
        g = -g if o["maximize"] else g
        if wd != 0:
            g = g + wd * p
        sq = alpha * sq + (1 - alpha) * g * g
        if o["centered"]:
            gavg = alpha * gavg + (1 - alpha) * g
            avg = np.sqrt(sq - gavg * gavg) + eps
        else:
            avg = np.sqrt(sq) + eps
        if mom > 0:
            buf = mom * buf + g / avg
            p = p - lr * buf
        else:
            p = p - lr * g / avg
        yield p


def ref_lion(o, p, grads, margins=None):
    """Lion (Chen et al. 2023, Algorithm 2)."""
    lr, b1, b2, wd = o["lr"], o["beta1"], o["beta2"], o["weight_decay"]
    m = np.zeros_like(p)
    for g in grads:
        c = b1 * m + (1 - b1) * g
        if margins is not None:
            # How far c is from a sign flip, relative to its terms' size: a
            # float32 kernel takes the same sign where this is well above 2^-24.
            scale = np.abs(b1 * m) + np.abs((1 - b1) * g)
            margins.append(float(np.min(np.abs(c) / np.where(scale > 0, scale, 1.0))))
        p = p * (1 - lr * wd) - lr * np.sign(c)
        m = b2 * m + (1 - b2) * g
        yield p


def ref_lamb(o, p, grads):
    """LAMB (You et al. 2020, Algorithm 2) with Adam's bias correction; the
    norms are over the whole tensor."""
    lr, b1, b2, eps, wd = o["lr"], o["beta1"], o["beta2"], o["eps"], o["weight_decay"]
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, 1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1**t)
        v_hat = v / (1 - b2**t)
        r = m_hat / (np.sqrt(v_hat) + eps) + wd * p
        pn = float(np.linalg.norm(p))
        rn = float(np.linalg.norm(r))
        trust = pn / rn if pn > 0 and rn > 0 else 1.0
        p = p - lr * trust * r
        yield p


def ref_adam_like(o, p, grads, update):
    """The part NAdam and RAdam share, in float64: maximize, the weight decay
    (coupled or decoupled), the moments m and v; update(t, g, p, m, v)
    returns the new p."""
    lr, b1, b2, wd = o["lr"], o["beta1"], o["beta2"], o["weight_decay"]
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, 1):
        g = -g if o["maximize"] else g
        if o["decoupled_weight_decay"]:
            p = p * (1 - lr * wd)
        elif wd != 0:
            g = g + wd * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = update(t, g, p, m, v)
        yield p


def ref_nadam(o, p, grads):
    """NAdam (Dozat 2016) as torch 2 defines it: momentum decay mu_t, its
    running product, the Nesterov look-ahead with mu_{t+1}."""
    lr, b1, b2, eps, md = o["lr"], o["beta1"], o["beta2"], o["eps"], o["momentum_decay"]
    prod = 1.0

    def update(t, g, p, m, v):
        nonlocal prod
        mu = b1 * (1 - 0.5 * 0.96 ** (t * md))
        mu_next = b1 * (1 - 0.5 * 0.96 ** ((t + 1) * md))
        prod *= mu
        denom = np.sqrt(v / (1 - b2**t)) + eps
        return p - lr * (1 - mu) / (1 - prod) * g / denom - lr * mu_next / (1 - prod * mu_next) * m / denom

    return ref_adam_like(o, p, grads, update)


def ref_radam(o, p, grads):
    """RAdam (Liu et al. 2020, Algorithm 2)."""
    lr, b1, b2, eps = o["lr"], o["beta1"], o["beta2"], o["eps"]
    rho_inf = 2 / (1 - b2) - 1

    def update(t, g, p, m, v):
        m_hat = m / (1 - b1**t)
        rho_t = rho_inf - 2 * t * b2**t / (1 - b2**t)
        if rho_t > 5:
            rect = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
            return p - lr * m_hat * rect * math.sqrt(1 - b2**t) / (np.sqrt(v) + eps)
        return p - lr * m_hat

    return ref_adam_like(o, p, grads, update)


def run_float64(opt, o, p0, grads, margins=None):
    """The float64 formulas; [(steps+1) x n] float64, row 0 = p0."""
    p = p0.astype(np.float64)
    g64 = [g.astype(np.float64) for g in grads]
    it = {
        "sgd": lambda: ref_sgd(o, p, g64),
        "adam": lambda: ref_adam(o, p, g64, decoupled=False),
        "adamw": lambda: ref_adam(o, p, g64, decoupled=True),
        "adagrad": lambda: ref_adagrad(o, p, g64),
        "rmsprop": lambda: ref_rmsprop(o, p, g64),
        "lion": lambda: ref_lion(o, p, g64, margins),
        "lamb": lambda: ref_lamb(o, p, g64),
        "nadam": lambda: ref_nadam(o, p, g64),
        "radam": lambda: ref_radam(o, p, g64),
    }[opt]()
    return np.stack([p] + list(it))


# ------------------------------------------------------------------ writing


def pack_str(s):
    b = s.encode()
    return struct.pack("<I", len(b)) + b


def pack_case(opt, name, precision, options, seed, grad_scale, n, sample, traj, grad1):
    """One case record (layout: tests/data/golden/README.md)."""
    steps = traj.shape[0] - 1
    parts = [pack_str(opt), pack_str(name), pack_str(precision),
             struct.pack("<I", len(options))]
    for k, v in options.items():
        parts.append(pack_str(k) + struct.pack("<d", float(v)))
    parts.append(struct.pack("<QfQII", seed, grad_scale, n, steps, len(sample)))
    parts.append(sample.astype("<u4").tobytes())
    parts.append(np.ascontiguousarray(traj[:, sample], dtype="<f4").tobytes())
    parts.append(np.ascontiguousarray(grad1[sample], dtype="<f4").tobytes())
    full = len(sample) < n
    parts.append(struct.pack("<Q", n if full else 0))
    if full:
        parts.append(np.ascontiguousarray(traj[-1], dtype="<f4").tobytes())
    return b"".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "tests", "data", "golden"))
    ap.add_argument("--only", help="one optimizer (e.g. adam)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)  # nothing here is random; set for good measure
    print(f"torch {torch.__version__}, numpy {np.__version__}")
    os.makedirs(args.out, exist_ok=True)
    t_start = time.time()
    total = 0
    for opt in OPTIONS:
        if args.only and opt != args.only:
            continue
        t0 = time.time()
        records = []
        worst_abs = worst_rel = 0.0
        margins = []
        for case, sizes in case_list(opt):
            for n in sizes:
                name = case.name(n)
                seed = case.seed(n)
                p0, grads = inputs(seed, n, STEPS, case.grad_scale, case.precision)
                if opt in TORCH_CLASS or opt in TORCH_OPS:
                    if opt in TORCH_OPS:
                        check_torch_ops(opt, case.options, p0, grads)
                    traj = run_torch(opt, case.options, p0, grads)
                    ref = run_float64(opt, case.options, p0, grads)
                    diff = np.abs(traj.astype(np.float64) - ref)
                    worst_abs = max(worst_abs, float(diff.max()))
                    worst_rel = max(worst_rel, float(
                        (diff / np.maximum(np.abs(ref), 1e-3)).max()))
                else:
                    ref = run_float64(opt, case.options, p0, grads, margins)
                    traj = ref.astype(np.float32)
                if not np.all(np.isfinite(traj)):
                    sys.exit(f"{name}: non-finite parameters")
                sample = np.arange(n, dtype=np.uint32) if n <= SIZE_MID else big_sample(n)
                records.append(pack_case(opt, name, case.precision, case.options, seed,
                                         case.grad_scale, n, sample, traj, grads[0]))
        blob = FORMAT_MAGIC + struct.pack("<II", FORMAT_VERSION, len(records)) + b"".join(records)
        path = os.path.join(args.out, opt + ".bin")
        with open(path + ".tmp", "wb") as f:
            f.write(blob)
        os.replace(path + ".tmp", path)
        total += len(blob)
        line = f"{opt:8s} {len(records):4d} cases {len(blob):9d} bytes {time.time() - t0:6.1f} s"
        if opt in TORCH_CLASS or opt in TORCH_OPS:
            line += (f"   torch vs float64 formulas: max abs {worst_abs:.3g},"
                     f" max rel {worst_rel:.3g} (|x| floored at 1e-3)")
        if margins:
            line += f"   smallest sign margin of c: {min(margins):.3g}"
        print(line, flush=True)
    print(f"total {total} bytes ({total / 2**20:.2f} MiB) in {time.time() - t_start:.1f} s")


if __name__ == "__main__":
    main()
