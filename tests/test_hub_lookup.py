"""Model resolution offline first: the catalog, then the local Hugging Face cache, then one bounded request.

The Hub is replaced at huggingface_hub's own seam (``get_session``) by a session that records each request; the
responses are real HTTP response objects, so huggingface_hub's own status handling (gated, not found) runs.
The tests assert the behaviour (one try, the timeout passed, the words of the error), never wall-clock time."""

from __future__ import annotations

import importlib
import io
import json
from typing import Any

import pytest
from helpers import one_line

import perfguide
from perfguide import PerfGuideError
from perfguide.cli import main
from perfguide.model.hub import HUB_TIMEOUT_S, TIMEOUT_ENV

http = importlib.import_module("httpx2") if importlib.util.find_spec("httpx2") else importlib.import_module("httpx")
GPT2_LIKE = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_layer": 2, "n_head": 4,
             "vocab_size": 1000, "n_positions": 128}


class FakeSession:
    """Stands in for huggingface_hub's HTTP session: records every request, then answers or fails."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[dict[str, Any]] = []

    def get(self, url: str, **kwargs: Any) -> Any:
        self.calls.append({"url": url, **kwargs})
        if isinstance(self.answer, Exception):
            raise self.answer
        status, body, headers = self.answer
        return http.Response(status, json=body, headers=headers, request=http.Request("GET", url))


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Any:
    """Network allowed, an empty HF cache, and a session the test decides."""
    import huggingface_hub.constants
    import huggingface_hub.utils

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))

    def install(answer: Any) -> FakeSession:
        session = FakeSession(answer)
        monkeypatch.setattr(huggingface_hub.utils, "get_session", lambda: session)
        return session

    return install


def test_an_unreachable_hub_fails_after_one_try_with_the_short_timeout(hub):
    session = hub(http.ConnectError("[Errno -3] Temporary failure in name resolution"))
    with pytest.raises(PerfGuideError) as exc:
        perfguide.recommend("some-org/not-in-the-catalog", hardware="a100-80gb")
    msg = one_line(exc, "HF_HUB_OFFLINE", "local directory", "one try", "ConnectError")
    assert len(session.calls) == 1
    assert session.calls[0]["timeout"] == HUB_TIMEOUT_S <= 10
    assert session.calls[0]["url"].endswith("/some-org/not-in-the-catalog/resolve/main/config.json")
    assert "Did you mean" not in msg


def test_the_failure_names_the_catalogs_close_matches(hub):
    hub(http.ConnectTimeout("timed out"))
    with pytest.raises(PerfGuideError) as exc:
        perfguide.recommend("meta-llama/Llama-3.1-8B-Instrukt", hardware="a100-80gb")
    one_line(exc, "Did you mean: meta-llama/Llama-3.1-8B", "HF_HUB_OFFLINE")


def test_cli_unreachable_hub_is_one_line_and_exit_2(hub, capsys):
    hub(http.ConnectError("no route to host"))
    code = main(["recommend", "some-org/not-in-the-catalog", "--hardware", "a100-80gb"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and "HF_HUB_OFFLINE" in err


def test_offline_mode_makes_no_request(hub, monkeypatch):
    session = hub(http.ConnectError("must not be called"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PerfGuideError) as exc:
        perfguide.recommend("some-org/not-in-the-catalog", hardware="a100-80gb")
    one_line(exc, "HF_HUB_OFFLINE is set", "local directory")
    assert session.calls == []


def test_a_config_in_the_local_hf_cache_is_read_without_the_network(hub, monkeypatch, tmp_path):
    import huggingface_hub.constants

    session = hub(http.ConnectError("must not be called"))
    repo = tmp_path / "hf-cache" / "models--some-org--cached-model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text(json.dumps(GPT2_LIKE))
    assert huggingface_hub.constants.HF_HUB_CACHE == str(tmp_path / "hf-cache")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")   # offline first: the cache answers even offline
    spec = perfguide.ModelSpec.from_any("some-org/cached-model")
    assert session.calls == []
    assert spec.source == "hub" and spec.num_layers == 2 and spec.hidden_size == 64


def test_a_reachable_hub_answers_in_one_request(hub):
    session = hub((200, GPT2_LIKE, {}))
    spec = perfguide.ModelSpec.from_any("some-org/tiny-gpt2")
    assert len(session.calls) == 1 and session.calls[0]["timeout"] == HUB_TIMEOUT_S
    # GPT-2 counts by hand: wte 1000x64 + wpe 128x64, per block 12*64^2 + 13*64, final norm 2*64, tied head
    assert spec.total_params == 1000 * 64 + 128 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64


def test_a_gated_repo_says_how_to_get_access(hub):
    hub((403, {"error": "gated"}, {"X-Error-Code": "GatedRepo"}))
    with pytest.raises(PerfGuideError) as exc:
        perfguide.ModelSpec.from_any("some-org/gated-model")
    one_line(exc, "gated", "HF_TOKEN", "local directory")


def test_a_missing_repo_says_so(hub):
    hub((404, {"error": "not found"}, {"X-Error-Code": "RepoNotFound"}))
    with pytest.raises(PerfGuideError) as exc:
        perfguide.ModelSpec.from_any("some-org/no-such-model")
    one_line(exc, "no model 'some-org/no-such-model'")


def test_the_timeout_can_be_raised_for_a_slow_link_and_is_validated(hub, monkeypatch):
    session = hub(http.ReadTimeout("slow"))
    monkeypatch.setenv(TIMEOUT_ENV, "20")
    with pytest.raises(PerfGuideError):
        perfguide.ModelSpec.from_any("some-org/not-in-the-catalog")
    assert [c["timeout"] for c in session.calls] == [20.0]
    monkeypatch.setenv(TIMEOUT_ENV, "soon")
    with pytest.raises(PerfGuideError) as exc:
        perfguide.ModelSpec.from_any("some-org/not-in-the-catalog")
    one_line(exc, TIMEOUT_ENV)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_progress_line_on_a_terminal_only(hub, monkeypatch):
    hub(http.ConnectError("down"))
    tty = _Tty()
    monkeypatch.setattr("sys.stderr", tty)
    with pytest.raises(PerfGuideError):
        perfguide.ModelSpec.from_any("some-org/not-in-the-catalog")
    assert "fetching the config of some-org/not-in-the-catalog" in tty.getvalue()
    pipe = io.StringIO()
    monkeypatch.setattr("sys.stderr", pipe)
    with pytest.raises(PerfGuideError):
        perfguide.ModelSpec.from_any("some-org/not-in-the-catalog")
    assert pipe.getvalue() == ""
