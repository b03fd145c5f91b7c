"""``ModelSpec.from_any``: one entry point for every way a user names a model.

Order for strings: an existing local path, a bare size ("7b"), the offline catalog, a config.json already in the
local Hugging Face cache, then one bounded request to the Hub (only when HF_HUB_OFFLINE is unset; model/hub.py). Local paths are read as JSON only: no repository code runs and no weights load.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .._text import plain_name
from ..errors import InvalidModelError, OfflineError, PerfGuideError, did_you_mean
from . import catalog
from .counting import analytic_count, build_spec, spec_from_config
from .facts import spec_from_facts
from .sizes import is_size_like, parse_size, spec_for_size
from .types import MAX_LAYERS, ModelSpec

logger = logging.getLogger(__name__)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_ACCEPTED = ("an nn.Module, a transformers PretrainedConfig, a config dict, a local directory or config.json path, "
             "a catalog name or hub id (e.g. 'gpt2', 'meta-llama/Llama-3.1-8B'), or a size like '7b'")
_OFFLINE_OPTIONS = ("pass a local directory containing config.json, a transformers PretrainedConfig, a catalog name "
                    "(perfguide.model.catalog.catalog_names()), or a size like '7b'")


def _is_instance(obj: Any, module: str, attr: str) -> bool:
    """isinstance check that never imports a heavy library: if it is not loaded, obj cannot be one of its types."""
    lib = sys.modules.get(module)
    return lib is not None and isinstance(obj, getattr(lib, attr))


def _offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in {"1", "true", "yes", "on"}
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _from_hf_config(config: Any, name: str, source: str, trust_remote_code: bool = False) -> ModelSpec:
    """A transformers PretrainedConfig; remote-code configs are instantiated on meta only if trusted."""
    data = config.to_dict()
    check_config_values(data)
    counted = analytic_count(data) if isinstance(data.get("model_type"), str) else None
    if counted is not None:
        return build_spec(data, counted, name, source)
    from .from_module import spec_via_meta_module

    return spec_via_meta_module(data, name, source, hf_config=config, trust_remote_code=trust_remote_code)


def _from_path(path: Path) -> ModelSpec:
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise InvalidModelError(f"{str(path)!r} has no config.json; accepted: a directory with config.json or a .json file.")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InvalidModelError(f"cannot read {str(file)!r} as a JSON config: {str(exc)[:160]}; accepted: a config.json "
                                "as transformers writes it (a JSON object, sub-configs a few levels deep).") from None
    if not isinstance(config, dict):
        raise InvalidModelError(f"{str(file)!r} holds a JSON {type(config).__name__}, not a config object.")
    check_config_values(config)
    return spec_from_config(config, str(config.get("_name_or_path") or path), "path")


def _from_hub(hub_id: str, trust_remote_code: bool) -> ModelSpec:
    """Offline first: a config.json in the local Hugging Face cache, else one bounded request (model/hub.py)."""
    from .hub import cached_config, fetch_config

    # compared without chat / instruct suffixes (catalog.normalize): they name the base model's shape, so an entry's
    # '-Instruct' must not outrank the base that was misspelled
    hint = did_you_mean(hub_id, catalog.short_names() + catalog.catalog_names(), key=catalog.normalize)
    config = cached_config(hub_id)
    if config is None:
        if _offline():
            raise OfflineError(f"model {hub_id!r} is not in the offline catalog or the local Hugging Face cache, and "
                               f"HF_HUB_OFFLINE is set.{hint} Offline, {_OFFLINE_OPTIONS}.")
        config = fetch_config(hub_id, hint, _OFFLINE_OPTIONS)
    if config.get("auto_map") and trust_remote_code:
        return _from_remote_code(hub_id)
    check_config_values(config)
    return spec_from_config(config, hub_id, "hub")


def _from_remote_code(hub_id: str) -> ModelSpec:
    """A config with its own code, trusted by the caller: transformers builds it (it fetches the code files)."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(hub_id, trust_remote_code=True)
    except Exception as exc:  # noqa: BLE001 - network, auth, the repository's own code: all end the same way
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise OfflineError(f"could not load the remote-code config of {hub_id!r} ({reason}); {_OFFLINE_OPTIONS}.") from None
    return _from_hf_config(config, hub_id, "hub", True)


def _existing_path(text: str) -> Path | None:
    """``text`` as an existing local path, else None. A name too long for the filesystem, a ``~user`` that does
    not exist or a NUL byte is simply not a path (then the catalog and hub rules decide), never an OSError."""
    try:
        path = Path(text).expanduser()
        return path if path.exists() else None
    except (OSError, RuntimeError, ValueError):
        return None


def _from_string(text: str, trust_remote_code: bool) -> ModelSpec:
    if not text.strip():
        raise InvalidModelError(f"empty model name; accepted: {_ACCEPTED}.")
    path = _existing_path(text)
    if path is not None:
        return _from_path(path)
    if parse_size(text) is not None:
        return spec_for_size(text)
    if is_size_like(text):
        raise InvalidModelError(f"model size {text.strip()!r} must be more than zero (at least one parameter); accepted: a size like '125m', '7b' or '1.5B'.")
    hub_id = catalog.lookup(text)
    if hub_id is not None:
        return _from_catalog(text, hub_id)
    mirror = catalog.mirrored(text)
    if mirror is not None:
        return _from_catalog(text, mirror[0], mirror[1])
    if not _HUB_ID.match(text.strip()):
        kind = "path does not exist" if text.startswith(("/", ".", "~")) or text.endswith(".json") else "is not a hub id"
        raise InvalidModelError(f"model {text!r}: {kind}; accepted: {_ACCEPTED}.")
    return _from_hub(text.strip(), trust_remote_code)


def _from_catalog(text: str, hub_id: str, added: dict[str, Any] | None = None) -> ModelSpec:
    """A catalogued shape under the name the user gave; ``added``: keys a mirror's re-upload puts in its config (a
    quantization_config), which the recorded meta-device counts still describe (quantization does not change them)."""
    facts = catalog.counted_of(hub_id)  # recorded meta-device counts: no transformers import for catalogued models
    name = _loaded_id(text, hub_id)
    config = catalog.config_of(hub_id) | (added or {}) | {"_name_or_path": name}
    if added is not None:   # a mirror organisation's re-upload (catalog.mirrored)
        logger.info("%s: read as a re-upload of %s%s", name, hub_id, "".join(f" with its {k}" for k in sorted(added)))
    return spec_from_facts(config, facts, name, "catalog") if facts else spec_from_config(config, name, "catalog")


def _loaded_id(text: str, hub_id: str) -> str:
    """The repo id the plan's code and commands load. The catalog files an -Instruct / -it / -chat variant under its
    base model (same shape), but the user's scripts must load the checkpoint they named, not the base: a repo id they
    gave stays theirs; a short name or a mere case variant takes the entry's id."""
    given = text.strip()
    if "/" in given and _HUB_ID.match(given) and given.lower() != hub_id.lower():
        return given
    return hub_id


#: Config values transformers itself would reject or misread; checked once, at the door.
_POSITIVE_OR_NONE = ("sliding_window",)
_NON_NEGATIVE_OR_NONE = ("max_position_embeddings", "n_positions")
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers", "decoder_layers",
              "num_decoder_layers")


def check_config_values(config: dict[str, Any]) -> None:
    """Refuse shape values a config can carry but no model can have (a NaN or negative context, a window of 0)."""
    for key in (*_POSITIVE_OR_NONE, *_NON_NEGATIVE_OR_NONE):
        value = config.get(key)
        if value is None:
            continue
        low = 1 if key in _POSITIVE_OR_NONE else 0
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            what = "a positive integer or null (no window)" if low else "a non-negative integer or null"
            raise InvalidModelError(f"config key {key!r} must be {what}, got {_short(value)}.")
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    if isinstance(heads, int) and isinstance(hidden, int) and 0 < hidden < heads and not config.get("head_dim"):
        raise InvalidModelError(f"config has num_attention_heads={heads} > hidden_size={hidden}, so a head would be 0 wide; "
                                "use num_attention_heads <= hidden_size (or give head_dim).")
    check_structure(config)
    text = config.get("text_config")
    if isinstance(text, dict) and text is not config:
        check_structure(text)


def check_structure(config: dict[str, Any]) -> None:
    """Refuse a layer count no model has (each layer is planned, so 10**8 of them would hang the planner) and
    grouped-query attention whose KV heads do not divide the query heads (transformers' repeat_kv needs
    num_attention_heads % num_key_value_heads == 0)."""
    for key in LAYER_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_LAYERS:
            raise InvalidModelError(f"config key {key!r} is {value}, more layers than any model has; accepted: "
                                    f"1 to {MAX_LAYERS}.")
    heads, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (heads, kv)) and heads % kv:  # type: ignore[operator]
        raise InvalidModelError(f"config has num_key_value_heads={kv}, which does not divide num_attention_heads={heads}; "
                                "accepted: a divisor of the head count (each KV head serves an equal group of query heads).")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _validation_message(exc: ValidationError) -> str:
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or "config"
    return f"the model's {field} is {_short(err.get('input'))}, which is not valid ({err['msg'].lower()})"


def spec_from_any(model: Any, *, trust_remote_code: bool = False) -> ModelSpec:
    """Resolve any accepted model description to a ModelSpec (see the module docstring for the order).

    Whatever a config holds, the result is a spec or one InvalidModelError line: reading a user's model is an
    input boundary, so a failure inside a counter or a meta-device build is reported, not raised through."""
    try:
        spec = _spec_from_any(model, trust_remote_code)
    except PerfGuideError:
        raise
    except ValidationError as exc:
        raise InvalidModelError(f"{_validation_message(exc)}; accepted: {_ACCEPTED}, with positive shape values.") from None
    except RecursionError:
        raise InvalidModelError(f"the model's config is nested too deeply to read; accepted: {_ACCEPTED}.") from None
    except Exception as exc:  # noqa: BLE001 - see the docstring: one line instead of a traceback from a counter
        reason = (str(exc).strip().splitlines() or [""])[0][:160]
        raise InvalidModelError(f"cannot read this model's shape ({type(exc).__name__}: {reason}); accepted: {_ACCEPTED}, "
                                "with architectures[0] a model class of the config's own model_type.") from None
    # a config's _name_or_path is shown in reports, warnings and plots: never as terminal escapes or markup
    name = plain_name(spec.name) or plain_name(spec.model_type) or "model"
    return spec if name == spec.name else spec.model_copy(update={"name": name})


def _spec_from_any(model: Any, trust_remote_code: bool) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        return _from_string(model, trust_remote_code)
    if isinstance(model, os.PathLike):
        return _from_path(Path(model))
    if isinstance(model, dict):
        config = dict(model)
        check_config_values(config)
        return spec_from_config(config, str(config.get("_name_or_path") or config.get("model_type") or "config"), "config")
    if _is_instance(model, "torch.nn", "Module"):
        from .adapted import with_module_state
        from .from_module import spec_from_module

        return with_module_state(spec_from_module(model), model)
    if _is_instance(model, "transformers", "PretrainedConfig"):
        name = getattr(model, "_name_or_path", "") or getattr(model, "model_type", "") or type(model).__name__
        return _from_hf_config(model, name, "config", trust_remote_code)
    if isinstance(model, type):
        raise InvalidModelError(f"got the class {model.__name__}, not an instance; pass an instance or a config object "
                                f"(accepted: {_ACCEPTED}).")
    raise InvalidModelError(f"cannot build a ModelSpec from {type(model).__name__} {str(model)[:60]!r}; accepted: {_ACCEPTED}.")
