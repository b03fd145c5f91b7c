"""Issue 26, security: every user-visible text passes one sanitiser by construction.

A hostile ``_name_or_path`` (Markdown link, HTML tag with an event handler, code span, terminal escapes, bidi
override) and a hostile ``model_type`` are fed through every renderer (text, markdown, rich, JSON, the notebook
display, the headline), the warnings, the Python API's exceptions, and the CLI's stderr and ``--json`` errors.
"""

from __future__ import annotations

import json
import warnings

import pytest

import perfguide
from perfguide.cli import main
from perfguide.errors import PerfGuideError

TINY = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=1000, hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
HOSTILE = "evil [click](https://x.example/a) <img src=x onerror=alert(1)> `rm -rf` \x1b[2J\x1b]0;title\x07 \u202etxt.exe\u202c |a|b|"
RAW_MARKS = ("<img", "onerror=alert(1)>", "](https://", "\x1b", "\u202e", "\x07", "`rm", "|a|")


def assert_inert(text: str) -> None:
    leaked = [m for m in RAW_MARKS if m in text]
    assert leaked == [], leaked


@pytest.fixture(scope="module")
def rec():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return perfguide.recommend({**TINY, "_name_or_path": HOSTILE}, "infer_gpu_one", hardware="a100-80gb",
                                   prompt_len=250, max_new_tokens=100)


@pytest.mark.parametrize("fmt", ["text", "markdown", "rich"])
def test_every_report_format_is_inert(rec, fmt):
    if fmt == "rich":
        pytest.importorskip("rich")
    for text in (rec.report(fmt), rec.report(fmt, brief=True)):
        assert "evil" in text
        if fmt == "rich":  # rich's own colour codes are the format; the config's escapes must not be there
            assert "\x1b[2J" not in text and "\x1b]0;" not in text
            text = text.replace("\x1b", "")
        assert_inert(text)


def test_the_notebook_display_json_and_warnings_are_inert(rec):
    assert_inert(rec._repr_markdown_())
    # the JSON as a consumer reads it back (decoded), the echoed config included: its strings are names
    for data in (json.loads(rec.to_json()), rec.to_dict(), json.loads(rec.summary().to_json()), json.loads(rec.memory.to_json())):
        assert_inert(json.dumps(data, ensure_ascii=False))
    assert "evil" in rec.to_dict()["request"]["model"]["config"]["_name_or_path"]   # kept as text, made inert
    assert all(not [m for m in RAW_MARKS if m in w] for w in rec.warnings)


def test_a_hostile_key_or_nested_value_in_the_config_is_inert_in_json():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = perfguide.recommend({**TINY, HOSTILE: {"x": [HOSTILE]}, "architectures": [HOSTILE]}, hardware="a100-80gb")
    assert_inert(json.dumps(r.to_dict(), ensure_ascii=False))
    assert_inert(json.dumps(json.loads(r.to_json()), ensure_ascii=False))


def test_check_and_estimate_json_are_inert(tmp_path, capsys):
    """perfguide check echoes what it read (the model named, the keys it ignored or refused) in its JSON."""
    cfg = tmp_path / "model" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({**TINY, "_name_or_path": HOSTILE}))
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"model_name_or_path": str(cfg.parent), "per_device_train_batch_size": 1, "bf16": True,
                                HOSTILE: HOSTILE, "run_name": HOSTILE}))
    for argv in (["check", str(args), "--hardware", "a100-80gb", "--seq-len", "64", "--json"],
                 ["estimate", str(cfg), "--hardware", "a100-80gb", "--json"]):
        code = main(argv)
        out, err = capsys.readouterr()
        assert code in (0, 3), err
        assert_inert(json.dumps(json.loads(out), ensure_ascii=False))
        assert_inert(err)


def test_api_exceptions_carrying_a_hostile_model_type_are_inert():
    with pytest.raises(PerfGuideError) as exc:
        perfguide.recommend({**TINY, "model_type": "\x1b[31mllama\u202e<b>x</b>", "num_key_value_heads": 3}, hardware="a100-80gb")
    assert "\x1b" not in str(exc.value) and "\u202e" not in str(exc.value) and "\n" not in str(exc.value)


def test_an_error_made_from_any_text_is_clean_by_construction():
    """Whoever raises it, whatever a library put into the message."""
    message = str(PerfGuideError("transformers says: \x1b[2J\u202eboom\nsecond line"))
    assert message == "transformers says: boomsecond line".replace("boomsecond", "boom second")


@pytest.mark.parametrize("as_json", [False, True])
def test_cli_errors_and_reports_are_inert(tmp_path, capsys, as_json):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**TINY, "_name_or_path": HOSTILE}))
    code = main(["recommend", str(cfg), "--hardware", "a100-80gb", "--markdown"])
    out, err = capsys.readouterr()
    assert code == 0
    assert_inert(out)
    assert_inert(err)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**TINY, "_name_or_path": HOSTILE, "model_type": "x\x1b[2J\u202e", "num_key_value_heads": 3}))
    code = main(["recommend", str(bad), "--hardware", "a100-80gb", *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    assert code == 2
    assert "\x1b" not in err and "\u202e" not in err
    if as_json:
        message = json.loads(out)["error"]["message"]
        assert "\x1b" not in message and "\u202e" not in message
