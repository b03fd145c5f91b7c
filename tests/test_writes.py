"""Issue 26, writes: every output (configs, plot, calibration) is all-or-nothing.

A fault is injected into the real system calls perfguide._files makes (only for its own temporary files, so
pytest's own I/O is untouched): disk full (ENOSPC), permission denied (EACCES), name too long (ENAMETOOLONG),
read-only filesystem (EROFS) and Ctrl-C, at each step (creating, writing, moving into place) of the second
file of a set. Afterwards the folder must hold exactly what it held before: same names, bytes and modes.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest

import perfguide
from perfguide import _files
from perfguide.cli import main
from perfguide.errors import OutputExistsError, PerfGuideError
from perfguide.integrations.files import write_files

FAULTS = {"ENOSPC": OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "EACCES": PermissionError(errno.EACCES, os.strerror(errno.EACCES)),
          "ENAMETOOLONG": OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG)),
          "EROFS": OSError(errno.EROFS, os.strerror(errno.EROFS)), "Ctrl-C": KeyboardInterrupt()}
STEPS = ("open", "write", "place")


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else b"<dir>", stat.S_IMODE(p.stat().st_mode))
            for p in sorted(folder.rglob("*"))}


class Faults:
    """Raise ``error`` at the ``nth`` call of ``step`` on one of perfguide's temporary files."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, step: str, error: BaseException, nth: int = 2) -> None:
        self.step, self.error, self.nth, self.calls, self.fds = step, error, nth, 0, set()
        real_open, real_write, real_link, real_replace = os.open, os.write, os.link, os.replace

        def hit() -> None:
            self.calls += 1
            if self.calls == self.nth:
                raise self.error

        def fake_open(path, flags, mode=0o777, *a, **k):
            if Path(path).name.startswith(".pg-") and step == "open":
                hit()
            fd = real_open(path, flags, mode, *a, **k)
            if Path(path).name.startswith(".pg-"):
                self.fds.add(fd)
            return fd

        def fake_write(fd, data):
            if fd in self.fds and step == "write":
                hit()
            return real_write(fd, data)

        def fake_move(real):
            def move(src, dst, *a, **k):
                if Path(src).name.endswith(".tmp") and step == "place":
                    hit()
                return real(src, dst, *a, **k)
            return move

        monkeypatch.setattr(_files.os, "open", fake_open)
        monkeypatch.setattr(_files.os, "write", fake_write)
        monkeypatch.setattr(_files.os, "link", fake_move(real_link))
        monkeypatch.setattr(_files.os, "replace", fake_move(real_replace))


FILES = {"accelerate.yaml": "distributed_type: DEEPSPEED\n", "accelerate_deepspeed.json": "{}\n",
         "training_args.json": '{"a": 1}\n', "sft_config.json": '{"b": 2}\n'}


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("existing", [False, True], ids=["new", "force-over-existing"])
def test_a_fault_at_any_step_leaves_the_folder_as_it_was(tmp_path, monkeypatch, step, fault, existing):
    out = tmp_path / "run"
    if existing:
        out.mkdir()
        for i, name in enumerate(FILES):
            (out / name).write_text(f"mine {i}\n")
            (out / name).chmod(0o640 if i % 2 else 0o644)
    before = snapshot(tmp_path)
    Faults(monkeypatch, step, FAULTS[fault])
    expected = KeyboardInterrupt if fault == "Ctrl-C" else PerfGuideError
    with pytest.raises(expected) as exc:
        write_files({out / name: text for name, text in FILES.items()}, overwrite=existing)
    monkeypatch.undo()
    assert snapshot(tmp_path) == before  # no half set, no 0-byte file, no temporary, no new folder
    if expected is PerfGuideError:
        assert "\n" not in str(exc.value) and "nothing was written" in str(exc.value)
    # and a rerun (no --force) is not refused by anything the failed one left
    if not existing:
        assert write_files({out / name: text for name, text in FILES.items()}) and snapshot(out)["sft_config.json"][0] == b'{"b": 2}\n'


def test_disk_full_during_cli_write_configs_writes_nothing_and_a_rerun_succeeds(tmp_path, monkeypatch, capsys):
    argv = ["recommend", "gpt2", "--scenario", "train_gpu_many", "--hardware", "a100-80gb:2", "--strategy", "zero2",
            "--write-configs", str(tmp_path / "cfg")]
    Faults(monkeypatch, "write", FAULTS["ENOSPC"])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    monkeypatch.undo()
    assert not (tmp_path / "cfg").exists()
    assert main(argv) == 0
    assert {p.name for p in (tmp_path / "cfg").iterdir()} == set(FILES)


@pytest.mark.parametrize("first", [["--write-accelerate-config"], ["--plot"]])
def test_a_refused_write_configs_dir_means_no_other_file_was_written(tmp_path, capsys, first):
    if first == ["--plot"]:
        pytest.importorskip("matplotlib")
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "training_args.json").write_text("{}")
    other = tmp_path / ("memory.png" if first == ["--plot"] else "mine.yaml")
    before = snapshot(tmp_path)
    code = main(["recommend", "gpt2", "--hardware", "a100-80gb", *first, str(other), "--write-configs", str(cfg)])
    err = capsys.readouterr().err
    assert code == 2 and "already exists" in err
    assert snapshot(tmp_path) == before and not other.exists()


def test_force_keeps_an_existing_files_mode(tmp_path, capsys):
    target = tmp_path / "accelerate.yaml"
    target.write_text("mine: true\n")
    target.chmod(0o644)
    code = main(["recommend", "gpt2", "--hardware", "a100-80gb", "--write-accelerate-config", str(target), "--force"])
    assert code == 0 and "mine" not in target.read_text()
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_a_new_file_gets_the_mode_open_gives_it(tmp_path):
    umask = os.umask(0o027)
    try:
        write_files({tmp_path / "a.json": "{}"})
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o640  # 0666 less the umask, not mkstemp's 0600


@pytest.mark.parametrize("name", ["x" * 300 + ".yaml", "d/" * 2100 + "a.yaml"])
def test_an_over_long_output_path_is_one_line_and_exit_2(tmp_path, capsys, name):
    code = main(["recommend", "gpt2", "--hardware", "a100-80gb", "--write-accelerate-config", str(tmp_path / name)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1 and "shorter" in err
    assert list(tmp_path.iterdir()) == []


def test_a_name_just_under_the_limit_still_gets_a_temporary(tmp_path):
    """The temporary name is short, so a 255-byte target name is written, not refused as too long."""
    written = write_files({tmp_path / ("y" * 250 + ".yaml"): "a: 1\n"})
    assert written[0].read_text() == "a: 1\n" and len(list(tmp_path.iterdir())) == 1


def test_the_same_path_twice_is_refused_before_writing(tmp_path, capsys):
    cfg = tmp_path / "cfg"
    code = main(["recommend", "gpt2", "--hardware", "a100-80gb", "--write-accelerate-config", str(cfg / "accelerate.yaml"),
                 "--write-configs", str(cfg)])
    assert code == 2 and "twice" in capsys.readouterr().err and not cfg.exists()


def test_a_file_that_appears_meanwhile_is_kept(tmp_path, monkeypatch):
    """Between the check and the move another process creates the target: it is kept, and nothing else written."""
    real_link = os.link

    def racing_link(src, dst, *a, **k):
        if Path(dst).name == "b.json" and not Path(dst).exists():
            Path(dst).write_text("theirs")
        return real_link(src, dst, *a, **k)

    monkeypatch.setattr(_files.os, "link", racing_link)
    with pytest.raises(OutputExistsError):
        write_files({tmp_path / "a.json": "1", tmp_path / "b.json": "2"})
    assert snapshot(tmp_path) == {"b.json": (b"theirs", stat.S_IMODE((tmp_path / "b.json").stat().st_mode))}


def test_plot_api_fault_leaves_the_old_plot(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    rec = perfguide.recommend("gpt2", hardware="a100-80gb")
    png = tmp_path / "m.png"
    png.write_bytes(b"old")
    Faults(monkeypatch, "write", FAULTS["ENOSPC"], nth=1)
    with pytest.raises(PerfGuideError, match="No space left"):
        rec.plot(png)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["m.png"] and png.read_bytes() == b"old"


@pytest.mark.parametrize("fault", FAULTS)
def test_calibration_store_fault_keeps_the_old_store(tmp_path, monkeypatch, fault):
    from perfguide.measure import calibration

    store = tmp_path / "calibration.json"
    store.write_text(json.dumps({"version": 2, "runs": []}))
    before = snapshot(tmp_path)
    Faults(monkeypatch, "write", FAULTS[fault], nth=1)
    if fault == "Ctrl-C":
        with pytest.raises(KeyboardInterrupt):
            calibration.write_store(store, calibration.Store())
    else:
        with pytest.raises(PerfGuideError):
            calibration.write_store(store, calibration.Store())
    monkeypatch.undo()
    after = snapshot(tmp_path)
    after.pop("calibration.json.lock", None)
    assert after == before


@pytest.mark.parametrize("parts", [("a\x00b.yaml",), ("\x00", "..", "c.yaml")])
def test_a_path_with_a_nul_byte_is_one_line(tmp_path, parts):
    """Found by bench/fuzz.py's output-path family: os.lstat raised ValueError (a NUL that '..' normalises away too)."""
    with pytest.raises(PerfGuideError, match="null"):
        write_files({tmp_path.joinpath(*parts): "a: 1\n"})
    assert list(tmp_path.iterdir()) == []
