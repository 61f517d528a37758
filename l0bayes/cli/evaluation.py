"""The final numbers of a run: test (and validation) metric, sizes and FLOPs, and the pruned model to export.

The pruned model comes back as ``(module, metadata)`` for :func:`l0bayes.pruning.export.save_pruned`: for the
networks the ``nn.Sequential`` of :func:`~l0bayes.pruning.prune.prune`; for the regressions the selected
features as ``SelectFeatures`` then ``nn.Linear(k, 1)`` with the Eq. 13 coefficients, then a flatten to one
output per example (the regression's prediction, or the logit for the logistic regression).
"""


def error_rate(model_fn, x, y, batch_size=1000):
    """Fraction of wrong labels: argmax over classes, or ``output > 0`` for one logit per example."""
    import torch

    wrong = 0
    with torch.no_grad():
        for i in range(0, x.shape[0], batch_size):
            out = model_fn(x[i : i + batch_size])
            pred = out.argmax(-1) if out.dim() > 1 else (out > 0).long()
            wrong += int((pred.cpu() != y[i : i + batch_size].long()).sum())
    return wrong / max(x.shape[0], 1)


def _rmse(predict, x, y):
    import torch

    with torch.no_grad():
        return float(torch.sqrt(((predict(x) - y) ** 2).mean()))


def _scaler(scaler):
    return None if scaler is None else {"mean": scaler.mean, "scale": scaler.scale}


def evaluate(cfg, model, data):
    """Final numbers: test (and validation) metric, sizes, FLOPs; ``out["pruned"]`` is ``(module, metadata)``."""
    model = model.cpu().eval()
    if cfg["model"] in ("linear", "logistic"):
        return _evaluate_regression(cfg, model, data)
    return _evaluate_network(cfg, model, data)


def _regression_module(coef, bias):
    """``x -> x[:, selected] @ coef[selected] + bias`` as plain layers (see the module docstring)."""
    import warnings

    import torch
    from torch import nn

    from ..pruning import SelectFeatures

    selected = (coef != 0).nonzero().flatten()
    with warnings.catch_warnings():  # no feature selected: a zero-width linear layer
        warnings.simplefilter("ignore", UserWarning)
        linear = nn.Linear(selected.numel(), 1)
    with torch.no_grad():
        linear.weight.copy_(coef[selected].unsqueeze(0))
        linear.bias.fill_(bias)
    return nn.Sequential(SelectFeatures(selected, coef.numel()), linear, nn.Flatten(0)).eval()


def _evaluate_regression(cfg, model, data):
    import torch

    coef = model.coefficients().detach()
    bias = float(model.bias.detach())
    active, p = int((coef != 0).sum()), model.num_features

    def predict(x):
        return x @ coef + bias

    out = {}
    if cfg["model"] == "linear":
        out["metric"] = "test RMSE (standardised y)"
        out["test"] = _rmse(predict, data.x_test, data.y_test)
        if data.x_val is not None:
            out["val"] = _rmse(predict, data.x_val, data.y_val)
    else:
        out["metric"] = "test error"
        out["test"] = error_rate(predict, data.x_test, data.y_test)
        if data.x_val is not None:
            out["val"] = error_rate(predict, data.x_val, data.y_val)
    q = model.inclusion_probabilities().detach()
    names = data.feature_names or [f"x{j}" for j in range(p)]
    headline = q.tolist()
    if cfg["objective"] == "bayes":  # the gates' probabilities, checked against the exact posterior
        from .inclusion import check_inclusion

        out["inclusion_check"] = check_inclusion(cfg, model, data, data.y_train, names)
        headline = out["inclusion_check"]["checked"]
    out.update(
        architecture=f"{active} of {p} features",
        dense_architecture=f"{p} features",
        params_pruned=active + 1,
        params_dense=p + 1,
        flops_pruned=2 * active,
        flops_dense=2 * p,
        expected_flops=float(2 * q.sum()),
        selected=[n for n, c in zip(names, coef.tolist(), strict=True) if c != 0],
        features=[[n, float(pi), float(c)] for n, pi, c in zip(names, headline, coef.tolist(), strict=True)],
    )
    metadata = {
        "model": cfg["model"],
        "architecture": out["architecture"],
        "feature_names": list(names),
        "selected": out["selected"],
        "coefficients": coef,
        "bias": bias,
        "inclusion_probabilities": torch.tensor(headline, dtype=torch.float64),
        "gate_inclusion_probabilities": q,
        "input_shape": [p],
        "x_scaler": _scaler(data.x_scaler),
        "y_scaler": _scaler(data.y_scaler),
    }
    out["pruned"] = (_regression_module(coef, bias), metadata)
    return out


def _evaluate_network(cfg, model, data):
    from ..pruning import PruneReport

    report = PruneReport.from_model(model.net, data.input_shape)
    pruned = report.pruned.eval()
    out = {"metric": "test error", "test": error_rate(pruned, data.x_test, data.y_test)}
    out["test_gated"] = error_rate(model, data.x_test, data.y_test)
    if data.x_val is not None:
        out["val"] = error_rate(pruned, data.x_val, data.y_val)
    dense = [model.net.in_features, *model.net.hidden] if cfg["model"] == "mlp" else None
    out.update(
        architecture=report.architecture,
        dense_architecture="-".join(map(str, dense)) if dense else _dense_lenet(model.net),
        params_pruned=report.params_pruned,
        params_dense=report.params_dense,
        flops_pruned=report.flops_pruned,
        flops_dense=report.flops_dense,
        expected_flops=report.expected_flops,
    )
    metadata = {
        "model": cfg["model"],
        "architecture": report.architecture,
        "input_shape": list(data.input_shape),
        "x_scaler": _scaler(data.x_scaler),
        "num_classes": data.num_classes,
    }
    out["pruned"] = (pruned, metadata)
    return out


def _dense_lenet(net):
    return "-".join(
        str(layer.num_gates) for layer in (m.gate for name, m in net.named_children() if hasattr(m, "gate"))
    )
