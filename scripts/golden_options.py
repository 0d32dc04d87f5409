"""The optimizer options of scripts/make_golden.py's cases.

Per optimizer: every option (torch's keyword, or beta1/beta2 for betas), its
torch default, and the non-default value the cases switch to, in the order
the case names and the golden files list them; the learning rate of its
cases and torch's default one; and the combinations recorded beyond the
small sizes. `lr` is set per case (the defaults move parameters too little to
see in 20 steps).
"""

# Options several optimizers share: (torch default, the value the cases use).
SHARED = {
    "beta1": (0.9, 0.8),
    "beta2": (0.999, 0.95),
    "eps": (1e-8, 1e-3),
    "weight_decay": (0.0, 0.1),
    "momentum": (0.0, 0.9),
    "amsgrad": (0, 1),
    "centered": (0, 1),
    "nesterov": (0, 1),
    "decoupled_weight_decay": (0, 1),
    "maximize": (0, 1),
}

# optimizer: (case lr, torch's default lr, options in order). An option is a
# name from SHARED or (name, (default, value)) of its own.
_TABLE = {
    "sgd": (0.05, None, ["momentum", ("dampening", (0.0, 0.1)), ("weight_decay", (0.0, 0.01)),
                         "nesterov", "maximize"]),
    "adam": (0.01, 1e-3, ["beta1", "beta2", "eps", "weight_decay", "amsgrad", "maximize"]),
    "adamw": (0.01, 1e-3, ["beta1", "beta2", "eps", ("weight_decay", (0.01, 0.1)), "amsgrad",
                           "maximize"]),
    "adagrad": (0.05, 1e-2, [("lr_decay", (0.0, 0.01)), "weight_decay",
                             ("initial_accumulator_value", (0.0, 0.1)), ("eps", (1e-10, 1e-3)),
                             "maximize"]),
    "rmsprop": (0.003, 1e-2, [("alpha", (0.99, 0.9)), "eps", "weight_decay", "momentum",
                              "centered", "maximize"]),
    "lion": (1e-3, 1e-4, [("beta1", (0.9, 0.95)), ("beta2", (0.99, 0.98)), "weight_decay"]),
    "lamb": (0.01, 1e-3, ["beta1", "beta2", ("eps", (1e-6, 1e-3)), ("weight_decay", (0.01, 0.1))]),
    "nadam": (0.01, 2e-3, ["beta1", "beta2", "eps", "weight_decay", ("momentum_decay", (4e-3, 0.1)),
                           "decoupled_weight_decay", "maximize"]),
    "radam": (0.01, 1e-3, ["beta1", "beta2", "eps", "weight_decay", "decoupled_weight_decay",
                           "maximize"]),
}


def _options(lr, entries):
    table = {"lr": lr}
    for e in entries:
        name, values = (e, SHARED[e]) if isinstance(e, str) else e
        table[name] = values
    return table


# optimizer: {"lr": case lr, option: (torch default, non-default value), ...}
OPTIONS = {opt: _options(lr, entries) for opt, (lr, _, entries) in _TABLE.items()}

# torch's default learning rates (SGD has none).
DEFAULT_LR = {opt: default for opt, (_, default, _) in _TABLE.items() if default is not None}

# The combinations recorded at n = 1000 as well: (changes, 1 if also at
# n = 65537); a change given as True means "the non-default value".
_T = True
_BETAS = {"beta1": _T, "beta2": _T}
SELECTED = {
    "sgd": [({}, 0), ({"momentum": _T}, 0), ({"momentum": _T, "dampening": _T}, 0),
            ({"momentum": _T, "nesterov": _T}, 0), ({"weight_decay": _T}, 0),
            ({"maximize": _T}, 0),
            ({"momentum": _T, "nesterov": _T, "weight_decay": _T, "maximize": _T}, 1)],
    "adam": [({}, 0), (_BETAS, 0), ({"weight_decay": _T}, 0),
             ({"amsgrad": _T}, 0), ({"amsgrad": _T, "maximize": _T}, 0),
             ({**_BETAS, "eps": _T, "weight_decay": _T, "amsgrad": _T}, 1)],
    "adamw": [({}, 0), ({"weight_decay": 0.0}, 0),
              ({"weight_decay": _T, "amsgrad": _T}, 0), ({**_BETAS, "eps": _T}, 0),
              ({**_BETAS, "weight_decay": _T, "amsgrad": _T, "maximize": _T}, 0)],
    "adagrad": [({}, 0), ({"lr_decay": _T}, 0), ({"weight_decay": _T}, 0),
                ({"initial_accumulator_value": _T, "eps": _T}, 0),
                ({"lr_decay": _T, "weight_decay": _T, "initial_accumulator_value": _T,
                  "maximize": _T}, 1)],
    "rmsprop": [({}, 0), ({"alpha": _T, "eps": _T}, 0), ({"weight_decay": _T}, 0),
                ({"momentum": _T}, 0), ({"centered": _T}, 0),
                ({"momentum": _T, "centered": _T, "weight_decay": _T, "maximize": _T}, 1)],
    "lion": [({"lr": DEFAULT_LR["lion"]}, 0), (_BETAS, 0), ({"weight_decay": _T}, 1)],
    "lamb": [({"lr": DEFAULT_LR["lamb"]}, 0), ({**_BETAS, "eps": _T}, 1),
             ({"weight_decay": 0.0}, 0), ({"weight_decay": _T}, 0)],
    "nadam": [({"lr": DEFAULT_LR["nadam"]}, 0), ({}, 0), (_BETAS, 0),
              ({"momentum_decay": _T}, 0), ({"weight_decay": _T}, 0),
              ({"weight_decay": _T, "decoupled_weight_decay": _T}, 0), ({"maximize": _T}, 0),
              ({**_BETAS, "eps": _T, "weight_decay": _T, "momentum_decay": _T,
                "decoupled_weight_decay": _T}, 1)],
    "radam": [({"lr": DEFAULT_LR["radam"]}, 0), ({}, 0), (_BETAS, 0),
              ({"weight_decay": _T}, 0),
              ({"weight_decay": _T, "decoupled_weight_decay": _T}, 0), ({"maximize": _T}, 0),
              ({**_BETAS, "eps": _T, "weight_decay": _T, "decoupled_weight_decay": _T,
                "maximize": _T}, 1)],
}
