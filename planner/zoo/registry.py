"""Finding models by name: the zoo's registry, user factories, and ``key=value`` options.

A model is a *factory*: a function taking keyword options with defaults and returning a
`ModelSpec`.  Zoo models and a user's model (``"package.module:factory"``) follow the same
contract, so the CLI and the importer treat them alike.  The options a factory accepts and their
defaults are read from its signature, so they are documented in exactly one place; the
effective options (defaults filled in) are recorded on the returned spec.

Full-size models can be built without allocating parameters::

    with torch.device("meta"):
        spec = get_model("vgg16")
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Callable

from ..errors import AutoparError
from .cnn import alexnet, lenet, vgg16
from .inception import inception_v3
from .nmt import nmt
from .resnet import resnet101
from .rnn import rnnlm, rnntc
from .spec import ModelSpec
from .transformer import transformer

Factory = Callable[..., ModelSpec]

_ZOO: dict[str, Factory] = {
    "lenet": lenet,
    "alexnet": alexnet,
    "vgg16": vgg16,
    "inception_v3": inception_v3,
    "resnet101": resnet101,
    "rnntc": rnntc,
    "rnnlm": rnnlm,
    "nmt": nmt,
    "transformer": transformer,
}


def list_models() -> list[str]:
    """Names of the zoo's models, in the order of the papers' tables."""
    return list(_ZOO)


def model_options(name: str) -> dict[str, object]:
    """The options of zoo model `name` with their defaults."""
    return _defaults(_factory(name))


def get_model(name: str, **options: object) -> ModelSpec:
    """Build zoo model `name` with `options` (checked against its defaults' types)."""
    factory = _factory(name)
    defaults = _defaults(factory)
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise AutoparError(
            f"model {name!r} has no option {', '.join(unknown)}; valid options: "
            + ", ".join(f"{k}={v!r}" for k, v in defaults.items())
        )
    values = {k: _coerce(name, k, v, defaults[k]) for k, v in options.items()}
    return _finish(name, factory, values)


def load_model(spec: str, **options: object) -> ModelSpec:
    """A zoo model by name, or a user's model ``"package.module:factory"`` built with ``factory(**options)``."""
    if ":" not in spec:
        return get_model(spec, **options)
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise AutoparError(f"model {spec!r}: expected 'package.module:factory' (both parts non-empty)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise AutoparError(
            f"model {spec!r}: cannot import module {module_name!r} ({e}); "
            "make sure it is installed or on PYTHONPATH"
        ) from e
    factory: object = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            public = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
            raise AutoparError(
                f"model {spec!r}: module {module_name!r} has no attribute {attr!r}; "
                f"callables it defines: {', '.join(public) or 'none'}"
            )
        factory = getattr(factory, part)
    if not callable(factory):
        raise AutoparError(f"model {spec!r}: {attr!r} is a {type(factory).__name__}, not a callable factory")
    try:
        inspect.signature(factory).bind(**options)
    except TypeError as e:
        raise AutoparError(f"model {spec!r}: {attr} does not accept options {sorted(options)}: {e}") from e
    except ValueError:
        pass  # no introspectable signature (a builtin): let the call itself decide
    return _finish(spec, factory, dict(options))


def parse_options(pairs: list[str]) -> dict[str, object]:
    """``["hidden=512", "lr=0.1", "tied=false", "blocks=3,4,6,3"]`` -> typed values.

    Values become bool (true/false), int, float, a tuple of ints (comma-separated) or stay strings.
    """
    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise AutoparError(f"option {pair!r} is not of the form key=value (e.g. batch=8)")
        if key in out:
            raise AutoparError(f"option {key!r} given twice")
        out[key] = _parse_value(raw.strip())
    return out


def _factory(name: str) -> Factory:
    try:
        return _ZOO[name]
    except KeyError:
        raise AutoparError(
            f"unknown model {name!r}; zoo models: {', '.join(_ZOO)} "
            "(or give 'package.module:factory' for your own model)"
        ) from None


def _defaults(factory: Callable) -> dict[str, object]:
    try:
        params = inspect.signature(factory).parameters.values()
    except ValueError:
        return {}
    return {p.name: p.default for p in params
            if p.default is not inspect.Parameter.empty
            and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def _finish(name: str, factory: Callable, options: dict[str, object]) -> ModelSpec:
    try:
        spec = factory(**options)
    except AutoparError:
        raise
    except Exception as e:  # noqa: BLE001 - a model's own code failing is the user's input, said in one line
        where = f" with {', '.join(f'{k}={v!r}' for k, v in options.items())}" if options else ""
        raise AutoparError(
            f"model {name!r}: the factory raised {type(e).__name__}: {e} when called{where}; fix the factory "
            "(call it in Python to see the traceback)"
        ) from e
    if not isinstance(spec, ModelSpec):
        raise AutoparError(
            f"model {name!r}: the factory returned a {type(spec).__name__}, not a ModelSpec; "
            "return autopar.planner.zoo.ModelSpec(name=..., module=..., inputs=..., target=..., loss=..., description=...)"
        )
    effective = {**_defaults(factory), **dict(spec.options), **options}
    return dataclasses.replace(spec, options=tuple(effective.items()))


def _coerce(model: str, key: str, value: object, default: object) -> object:
    """Check `value` against the type of the option's default; widen int to float, parse tuples."""
    bad = AutoparError(
        f"model {model!r}: option {key}={value!r} should be a {type(default).__name__} like its default {default!r}"
    )
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise bad
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if isinstance(default, tuple):
        if isinstance(value, int) and not isinstance(value, bool):
            value = (value,)
        if isinstance(value, str):
            value = _parse_value(value)
            value = value if isinstance(value, tuple) else (value,)
        if not isinstance(value, (tuple, list)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise bad
        return tuple(value)
    return value


def _parse_value(raw: str) -> object:
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    for convert in (int, float):
        try:
            return convert(raw)
        except ValueError:
            pass
    parts = raw.split(",")
    if len(parts) > 1:
        try:
            return tuple(int(p) for p in parts)
        except ValueError:
            pass
    return raw
