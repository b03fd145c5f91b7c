"""Launch files: every file a launch command names exists once written, the names inside are relative (the set
carries to another machine or directory), and a user's existing file or symlink is never overwritten or written
through unless asked. Commands are read back with accelerate's own launcher parser."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
yaml = pytest.importorskip("yaml")

from accelerate.commands.launch import _validate_launch_command, launch_command_parser  # noqa: E402

try:  # tests/ as a plain folder or as a package
    from helpers import make_rec, one_line
except ImportError:  # pragma: no cover
    from tests.helpers import make_rec, one_line

from perfguide.errors import OutputExistsError  # noqa: E402

ZERO3 = {"autocast": "bf16", "num_gpus": 8, "strategy": "zero3", "offload_optimizer": True}
FSDP = {"autocast": "bf16", "num_gpus": 8, "strategy": "fsdp"}
FILE_FLAGS = ("--config_file", "--deepspeed_config_file")


def launched_args(cmd: str, cwd: Path):
    """What `accelerate launch` makes of the command run in ``cwd`` (the YAML is read, nothing starts)."""
    argv = shlex.split(cmd)
    assert argv[:2] == ["accelerate", "launch"], cmd
    named = {flag: argv[i + 1] for i, flag in enumerate(argv) if flag in FILE_FLAGS}
    for flag, value in named.items():
        assert (cwd / value).is_file(), f"{flag} {value} does not exist under {cwd}: {cmd}"
    rest = argv[2:]
    for i, flag in enumerate(rest[:-1]):
        if flag in FILE_FLAGS:
            rest[i + 1] = str(cwd / rest[i + 1])  # as the launcher resolves them from its working directory
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(rest))
    return args, named


def test_zero_plan_files_are_relative_and_the_command_names_only_existing_files(tmp_path):
    rec = make_rec(ZERO3)
    yaml_path = rec.write_accelerate_config(tmp_path / "cfg" / "run.yaml")
    assert sorted(p.name for p in (tmp_path / "cfg").iterdir()) == ["run.yaml", "run_deepspeed.json"]
    cfg = yaml.safe_load(yaml_path.read_text())
    assert cfg["deepspeed_config"]["deepspeed_config_file"] == "run_deepspeed.json"  # no absolute path inside
    assert str(tmp_path) not in yaml_path.read_text()
    args, named = launched_args(rec.launch_command("train.py", config_file="cfg/run.yaml"), tmp_path)
    assert named == {"--config_file": "cfg/run.yaml", "--deepspeed_config_file": "cfg/run_deepspeed.json"}
    assert args.use_deepspeed and args.num_processes == 8
    assert json.loads(Path(args.deepspeed_config_file).read_text()) == rec.deepspeed_config()


def test_the_written_set_carries_to_another_directory(tmp_path):
    rec = make_rec(ZERO3)
    rec.write_accelerate_config(tmp_path / "laptop" / "run.yaml")
    shutil.move(tmp_path / "laptop", tmp_path / "cluster")  # as if copied to the machine that runs it
    args, _ = launched_args(rec.launch_command("train.py", config_file="cluster/run.yaml"), tmp_path)
    assert json.loads(Path(args.deepspeed_config_file).read_text()) == rec.deepspeed_config()


def test_inline_zero_command_names_the_default_file_write_accelerate_config_writes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rec = make_rec(ZERO3)
    cmd = rec.launch_command("train.py")
    assert "--config_file" not in cmd
    with pytest.raises(AssertionError, match="does not exist"):
        launched_args(cmd, tmp_path)  # control: before writing, the named JSON is missing
    rec.write_accelerate_config()
    args, named = launched_args(cmd, tmp_path)
    assert named == {"--deepspeed_config_file": "accelerate_deepspeed.json"} and args.use_deepspeed
    assert json.loads((tmp_path / named["--deepspeed_config_file"]).read_text()) == rec.deepspeed_config()


def test_fsdp_plan_writes_only_the_yaml_and_its_command_names_it(tmp_path):
    rec = make_rec(FSDP)
    rec.write_accelerate_config(tmp_path / "fsdp.yaml")
    assert [p.name for p in tmp_path.iterdir()] == ["fsdp.yaml"]
    args, named = launched_args(rec.launch_command("train.py", config_file="fsdp.yaml"), tmp_path)
    assert named == {"--config_file": "fsdp.yaml"} and args.use_fsdp


def test_existing_files_are_kept_unless_overwrite(tmp_path):
    rec = make_rec(ZERO3)
    mine = tmp_path / "run_deepspeed.json"
    mine.write_text('{"mine": true}')
    with pytest.raises(OutputExistsError) as info:
        rec.write_accelerate_config(tmp_path / "run.yaml")
    one_line(info, str(mine), "overwrite=True")
    assert mine.read_text() == '{"mine": true}' and not (tmp_path / "run.yaml").exists()  # all or nothing
    rec.write_accelerate_config(tmp_path / "run.yaml", overwrite=True)
    assert json.loads(mine.read_text()) == rec.deepspeed_config()


def test_symlinks_are_never_written_through(tmp_path):
    rec = make_rec(FSDP)
    target = tmp_path / "elsewhere.yaml"
    target.write_text("user: data\n")
    link = tmp_path / "accelerate.yaml"
    link.symlink_to(target)
    with pytest.raises(OutputExistsError) as info:
        rec.write_accelerate_config(link)
    one_line(info, "symlink")
    rec.write_accelerate_config(link, overwrite=True)
    assert target.read_text() == "user: data\n"  # the link was replaced, its target untouched
    assert not link.is_symlink() and yaml.safe_load(link.read_text())["distributed_type"] == "FSDP"
    dangling = tmp_path / "gone.yaml"
    dangling.symlink_to(tmp_path / "missing" / "x.yaml")
    with pytest.raises(OutputExistsError):
        rec.write_accelerate_config(dangling)
    assert not (tmp_path / "missing").exists()


def test_a_directory_is_not_a_config_path(tmp_path):
    with pytest.raises(OutputExistsError) as info:
        make_rec(FSDP).write_accelerate_config(tmp_path)
    one_line(info, "directory")
