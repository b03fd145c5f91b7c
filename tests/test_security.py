"""perfguide reads shapes, never runs a repository's code and never opens its weights.

A local model directory is the attack surface: a config.json whose ``auto_map`` points at a modeling file
that would create a marker file if it were ever imported, next to weight files that would create another if
they were ever unpickled. Python's audit hooks (PEP 578) watch every file opened, module imported and process
started while perfguide works on that directory; the markers show whether anything ran.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import perfguide
from perfguide import ModelSpec, PerfGuideError, estimate, recommend
from perfguide.errors import InvalidModelError, OfflineError

TINY = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)

_EVENTS: list[tuple[str, tuple]] = []
_WATCHING: list[bool] = [False]


def _hook(event: str, args: tuple) -> None:
    if _WATCHING[0] and event in ("open", "import", "exec", "compile", "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn"):
        _EVENTS.append((event, args))


sys.addaudithook(_hook)  # hooks cannot be removed; _WATCHING turns this one on only inside watch()


class _Touch:
    """Unpickling this creates ``path``: the marker for 'someone loaded the weights'."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (Path.touch, (Path(self.path),))


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def hostile_repo(root: Path, model_type: str) -> Path:
    """A model directory whose code and weights leave markers in ``root`` if they are ever run or loaded."""
    repo = root / "repo"
    repo.mkdir()
    code_marker, weights_marker = root / "CODE_RAN", root / "WEIGHTS_LOADED"
    payload = f"import pathlib\npathlib.Path({str(code_marker)!r}).touch()\n"
    (repo / "modeling_evil.py").write_text(payload + "class EvilForCausalLM: pass\n")
    (repo / "configuration_evil.py").write_text(payload + "class EvilConfig: pass\n")
    (repo / "__init__.py").write_text(payload)
    config = {**TINY, "model_type": model_type, "architectures": ["EvilForCausalLM"],
              "auto_map": {"AutoConfig": "configuration_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}}
    (repo / "config.json").write_text(json.dumps(config))
    (repo / "pytorch_model.bin").write_bytes(pickle.dumps(_Touch(str(weights_marker))))
    (repo / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    return repo


@pytest.fixture
def watch() -> Iterator[list[tuple[str, tuple]]]:
    _EVENTS.clear()
    _WATCHING[0] = True
    try:
        yield _EVENTS
    finally:
        _WATCHING[0] = False


def opened_in(events: list[tuple[str, tuple]], folder: Path) -> set[str]:
    return {Path(str(a[0])).name for e, a in events if e == "open" and isinstance(a[0], (str, bytes, os.PathLike))
            and str(folder) in os.fsdecode(a[0])}


def assert_nothing_ran(root: Path, repo: Path, events: list[tuple[str, tuple]]) -> None:
    assert not (root / "CODE_RAN").exists(), "repository code was executed"
    assert not (root / "WEIGHTS_LOADED").exists(), "weights were unpickled"
    assert opened_in(events, repo) <= {"config.json"}, opened_in(events, repo)
    assert not [a for e, a in events if e == "import" and "evil" in str(a[0])]
    assert not [a for e, a in events if e.startswith(("subprocess", "os.system", "os.exec", "os.posix_spawn"))]
    assert sorted(p.name for p in root.iterdir()) == ["repo"]  # nothing new was created next to it


@pytest.mark.parametrize("trust", [False, True])
def test_known_model_type_with_auto_map_is_read_as_json_only(tmp_path: Path, watch, trust: bool) -> None:
    """model_type 'llama' with an auto_map: the built-in counter is used; the remote class is never imported."""
    repo = hostile_repo(tmp_path, "llama")
    watch.clear()  # from here on, everything is perfguide's doing
    spec = ModelSpec.from_any(str(repo), trust_remote_code=trust)
    rec = recommend(str(repo), "train_gpu_one", hardware="a100", seq_len=32, global_batch_size=4, trust_remote_code=trust)
    rec.report()
    rec.training_args_dict()
    assert_nothing_ran(tmp_path, repo, watch)
    # exact count from the real transformers module built from the same numbers (no remote code involved)
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    with torch.device("meta"):
        real = AutoModelForCausalLM.from_config(LlamaConfig(**TINY))
    assert spec.total_params == sum(p.numel() for p in real.parameters())


@pytest.mark.parametrize("trust", [False, True])
def test_unknown_model_type_with_auto_map_never_runs_its_code(tmp_path: Path, watch, trust: bool) -> None:
    """A remote-code-only architecture from a local folder is refused in one line instead of imported."""
    repo = hostile_repo(tmp_path, "evil_arch")
    watch.clear()
    with pytest.raises(InvalidModelError) as exc:
        recommend(str(repo), hardware="a100", trust_remote_code=trust)
    assert "\n" not in str(exc.value) and "evil_arch" in str(exc.value)
    with pytest.raises(PerfGuideError):
        estimate(repo, {"micro_batch_size": 1, "seq_len": 16})
    assert_nothing_ran(tmp_path, repo, watch)


def test_config_json_path_directly(tmp_path: Path, watch) -> None:
    repo = hostile_repo(tmp_path, "llama")
    watch.clear()
    mem = estimate(repo / "config.json", {"micro_batch_size": 1, "seq_len": 16}, hardware="a100")
    assert mem.weights > 0
    assert_nothing_ran(tmp_path, repo, watch)


def test_trace_mode_builds_from_the_config_without_remote_code(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                                                               monkeypatch: pytest.MonkeyPatch, watch) -> None:
    """The exact (fake-tensor) mode instantiates the architecture from transformers' own classes only."""
    monkeypatch.setenv("PERFGUIDE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))  # trace for real, not from cache
    repo = hostile_repo(tmp_path, "llama")
    watch.clear()
    mem = estimate(str(repo), {"micro_batch_size": 1, "seq_len": 16, "device": "cpu"}, method="trace")
    assert mem.method == "trace" and mem.peak_allocated > 0
    assert_nothing_ran(tmp_path, repo, watch)


# --- the hub: trust_remote_code stays False unless the user passes it ---------------------------------

class _HubCall(Exception):
    pass


REMOTE_CODE_CONFIG = {"model_type": "custom-arch", "architectures": ["CustomForCausalLM"], "hidden_size": 64,
                      "auto_map": {"AutoConfig": "configuration_custom.CustomConfig"}}


@pytest.fixture
def hub_spy(monkeypatch: pytest.MonkeyPatch, tmp_path) -> list[dict]:
    """The Hub answers a config that brings its own code; records the kwargs perfguide gives
    AutoConfig.from_pretrained (the only way that code could run), which then fails like a hub error."""
    import huggingface_hub.constants
    import huggingface_hub.utils
    import transformers

    calls: list[dict] = []

    def spy(name: str, **kwargs: object) -> None:
        calls.append({"name": name, **kwargs})
        raise _HubCall("offline test: no hub")

    class Session:
        def get(self, url: str, **kwargs: object) -> object:
            import importlib

            http = importlib.import_module("httpx2") if importlib.util.find_spec("httpx2") else importlib.import_module("httpx")
            return http.Response(200, json=REMOTE_CODE_CONFIG, request=http.Request("GET", url))

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(huggingface_hub.utils, "get_session", Session)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", spy)
    return calls


def test_hub_config_read_as_json_without_remote_code_by_default(hub_spy: list[dict]) -> None:
    """Untrusted, a config's auto_map is never followed: the JSON is read as data and refused in one line."""
    with pytest.raises(PerfGuideError) as exc:
        recommend("someorg/custom-arch", hardware="a100")
    assert "\n" not in str(exc.value)
    assert hub_spy == []


def test_hub_remote_code_only_when_the_user_passes_it(hub_spy: list[dict]) -> None:
    with pytest.raises(OfflineError):
        recommend("someorg/custom-arch", hardware="a100", trust_remote_code=True)
    assert hub_spy == [{"name": "someorg/custom-arch", "trust_remote_code": True}]


def test_model_kwargs_never_turn_on_remote_code_by_themselves() -> None:
    rec = recommend("gpt2", "infer_gpu_one", hardware="a100")
    assert "trust_remote_code" not in rec.model_kwargs()
    rec = recommend("gpt2", "infer_gpu_one", hardware="a100", trust_remote_code=True)
    assert rec.model_kwargs()["trust_remote_code"] is True


def test_importing_perfguide_touches_no_model_code() -> None:
    """The public API resolves catalog names and sizes from JSON data alone."""
    assert perfguide.ModelSpec.from_any("7b").source == "size"
    assert perfguide.ModelSpec.from_any("gpt2").source == "catalog"
