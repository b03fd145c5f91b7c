"""A hub id's config.json, offline first: the local Hugging Face cache, then one bounded request.

``AutoConfig.from_pretrained`` retries a failed metadata request with a 60 s timeout before it gives up, so with
no network a hub id took ~28 s of silence to fail. perfguide needs one small JSON file, so it asks once: one GET
with a short timeout (the token, for gated repos, as huggingface_hub sends it), and a failure is one line that
says what to do instead (HF_HUB_OFFLINE, a local path, the catalog's close matches).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import InvalidModelError, OfflineError

#: seconds the one request may take: a config.json is a few KiB, so a slower answer means no usable network
HUB_TIMEOUT_S = 5.0
TIMEOUT_ENV = "PERFGUIDE_HUB_TIMEOUT"


def hub_timeout() -> float:
    """``PERFGUIDE_HUB_TIMEOUT`` seconds when set to a positive number (a slow link), else ``HUB_TIMEOUT_S``."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    try:
        value = float(raw) if raw else HUB_TIMEOUT_S
    except ValueError:
        raise InvalidModelError(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds; use e.g. {TIMEOUT_ENV}=15") from None
    if not 0 < value <= 600:
        raise InvalidModelError(f"{TIMEOUT_ENV}={raw!r} must be more than 0 and at most 600 seconds; use e.g. {TIMEOUT_ENV}=15")
    return value


def cached_config(hub_id: str) -> dict[str, Any] | None:
    """The config.json a previous download left in the Hugging Face cache, read without any network."""
    from huggingface_hub import try_to_load_from_cache

    try:
        path = try_to_load_from_cache(hub_id, "config.json")
    except ValueError:   # not a valid repo id for the cache layout
        return None
    if not isinstance(path, str):
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _progress(message: str) -> None:
    """One line on a terminal while the request runs; pipes and logs stay clean."""
    if sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


def fetch_config(hub_id: str, hint: str, alternatives: str) -> dict[str, Any]:
    """One GET of ``config.json`` with a short timeout; every failure is one OfflineError line."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status, validate_repo_id

    timeout = hub_timeout()
    _progress(f"fetching the config of {hub_id} from the Hugging Face Hub (one try, {timeout:g} s timeout) ...")
    try:
        validate_repo_id(hub_id)   # a malformed id fails here, before any request
        response = get_session().get(hf_hub_url(hub_id, "config.json"), headers=build_hf_headers(), timeout=timeout,
                                     follow_redirects=True)
        hf_raise_for_status(response)
        data = response.json()
    except Exception as exc:  # noqa: BLE001 - network, auth, missing repo: each ends in one line
        raise OfflineError(_failure(hub_id, exc, timeout, hint, alternatives)) from None
    if not isinstance(data, dict):
        raise InvalidModelError(f"the config.json of {hub_id!r} on the Hub is a JSON {type(data).__name__}, not a config object; "
                                "pass a local directory with a config.json as transformers writes it.")
    return data


def _failure(hub_id: str, exc: Exception, timeout: float, hint: str, alternatives: str) -> str:
    """What went wrong, said the way the user can act on it."""
    kind = type(exc).__name__
    first = (str(exc).strip().splitlines() or [kind])[0][:120]
    if kind == "GatedRepoError":
        return (f"{hub_id!r} is gated on the Hugging Face Hub: accept its license on huggingface.co and log in "
                f"(hf auth login, or set HF_TOKEN); or {alternatives}.{hint}")
    if kind == "RepositoryNotFoundError":
        return f"no model {hub_id!r} on the Hugging Face Hub (or it is private: log in with hf auth login).{hint} Or {alternatives}."
    if kind in ("EntryNotFoundError", "RemoteEntryNotFoundError"):
        return f"{hub_id!r} on the Hugging Face Hub has no config.json; {alternatives}.{hint}"
    return (f"could not fetch the config of {hub_id!r} from the Hugging Face Hub in one try of {timeout:g} s ({kind}: {first}).{hint} "
            f"Set HF_HUB_OFFLINE=1 to skip the look-up, or {alternatives}.")
