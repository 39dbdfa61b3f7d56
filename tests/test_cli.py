"""`grpo-edu`: every bad argument or input file is one line on stderr that names the
argument, what was expected and what was given, with exit code 2; --debug adds the
traceback; a bug still shows its traceback."""

import errno
import json
from pathlib import Path

import pytest
import torch

from grpo_edu.training import trainer
from grpo_edu.commands.cli import main
from grpo_edu.config import TrainConfig


@pytest.fixture(autouse=True)
def keep_torch_threads():
    threads = torch.get_num_threads()  # an in-process `train` sets them from its config
    yield
    torch.set_num_threads(threads)


def one_line_error(capsys, argv, *fragments):
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


def a_run_dir(tmp_path, name="run") -> Path:
    """A run directory as `grpo-edu train` leaves it before its first checkpoint."""
    run = tmp_path / name
    run.mkdir()
    config = TrainConfig(output_dir=str(run), progress=False, eval_size=4, threads=1)
    (run / "config.json").write_text(json.dumps(config.to_dict()))
    (run / "metrics.jsonl").write_text("")
    return run


# ------------------------------------------------------------------ --resume

def test_resume_of_a_missing_folder(capsys, tmp_path):
    one_line_error(capsys, ["train", "--resume", str(tmp_path / "nope")],
                   "grpo-edu train: --resume: expected a run directory", "nope", "no such folder")


def test_resume_of_a_file(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    one_line_error(capsys, ["train", "--resume", str(tmp_path / "file")], "--resume", "not a folder")


def test_resume_of_a_folder_that_is_not_a_run(capsys, tmp_path):
    one_line_error(capsys, ["train", "--resume", str(tmp_path)], "--resume: expected a run directory",
                   str(tmp_path), "holds no config.json")


def test_resume_of_a_run_whose_config_is_not_json(capsys, tmp_path):
    run = a_run_dir(tmp_path)
    (run / "config.json").write_text('{"steps": ')
    one_line_error(capsys, ["train", "--resume", str(run)], f"--resume {run}: expected config.json to hold JSON")


def test_resume_of_a_run_whose_config_has_an_unknown_key(capsys, tmp_path):
    run = a_run_dir(tmp_path)
    (run / "config.json").write_text('{"stepz": 3}')
    one_line_error(capsys, ["train", "--resume", str(run)], f"--resume {run / 'config.json'}: unknown config key 'stepz'")


def test_resume_with_a_bad_set_names_set(capsys, tmp_path):
    run = a_run_dir(tmp_path)
    one_line_error(capsys, ["train", "--resume", str(run), "--set", "steps=many"],
                   "--set: config key 'steps' must be an integer, got 'many'")


def test_resume_of_a_run_with_no_checkpoint(capsys, tmp_path):
    run = a_run_dir(tmp_path)
    one_line_error(capsys, ["train", "--resume", str(run)], f"--resume {run}: expected a checkpoint",
                   "found none", "start it again without --resume")


def test_resume_with_every_checkpoint_damaged(capsys, tmp_path):
    run = a_run_dir(tmp_path)
    for step in (1, 2):  # what a power cut can leave: renamed folders holding empty files
        folder = run / "checkpoints" / f"step-{step:06d}"
        folder.mkdir(parents=True)
        for name in ("policy.safetensors", "reference.safetensors", "trainer_state.pt"):
            (folder / name).write_bytes(b"")
    (run / "checkpoints" / "latest").write_text("step-000002\n")
    code = main(["train", "--resume", str(run)])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and "Traceback" not in "\n".join(err)
    # one line per damaged checkpoint as it is skipped, then the one-line refusal
    assert "step-000002 is damaged" in err[0] and "step-000001 is damaged" in err[1]
    assert len(err) == 3 and err[2].startswith(f"grpo-edu train: --resume {run}: expected a complete checkpoint")
    for step in (1, 2):
        assert str(run / "checkpoints" / f"step-{step:06d}" / "trainer_state.pt") + " is empty" in err[2]


# ------------------------------------------------------------------ --config and --set

def test_config_file_missing(capsys, tmp_path):
    one_line_error(capsys, ["train", "--config", str(tmp_path / "nope.toml")],
                   "--config: expected a TOML file", "nope.toml", "no such file")


def test_config_file_is_a_folder(capsys, tmp_path):
    one_line_error(capsys, ["train", "--config", str(tmp_path)], "--config: expected a TOML file", "a folder")


def test_config_file_is_not_toml(capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("steps = \n")
    one_line_error(capsys, ["train", "--config", str(bad)], f"--config {bad}: expected valid TOML", "line 1")


def test_config_file_with_a_bad_key_names_the_file(capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("stepz = 3\n")
    one_line_error(capsys, ["train", "--config", str(bad)], f"--config {bad}: unknown config key 'stepz'")


def test_a_file_fixed_by_set_is_accepted_and_a_bad_set_is_blamed(capsys, tmp_path):
    file = tmp_path / "ok.toml"
    file.write_text("num_mini_batches = 4\nprompts_per_step = 8\n")
    one_line_error(capsys, ["train", "--config", str(file), "--set", "prompts_per_step=6"],
                   "grpo-edu train: --set: config key 'num_mini_batches' (4) must divide prompts_per_step (6)")


@pytest.mark.parametrize("override, fragment", [
    ("steps=abc", "--set: config key 'steps' must be an integer, got 'abc'"),
    ("stepz=3", "--set: unknown config key 'stepz'"),
    ("steps", "--set expects key=value, got 'steps'"),
    ("task=chess", "--set: config key 'task' must be one of"),
])
def test_bad_set(capsys, override, fragment):
    one_line_error(capsys, ["train", "--set", override], "grpo-edu train: " + fragment)


# ------------------------------------------------------------------ output_dir

def test_output_dir_under_a_regular_file(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    target = tmp_path / "file" / "run"
    one_line_error(capsys, ["train", "--set", f"output_dir={target}"],
                   "output_dir: expected a folder that can be created and written", str(target), "Not a directory")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_output_dir_that_cannot_be_created(capsys):
    one_line_error(capsys, ["train", "--set", "output_dir=/proc/grpo-edu-run"],
                   "output_dir: expected a folder that can be created and written", "/proc/grpo-edu-run")


def test_a_full_disk_during_training_is_one_line(capsys, tmp_path, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(trainer, "train", disk_full)
    one_line_error(capsys, ["train", "--set", f"output_dir={tmp_path / 'run'}"],
                   "output_dir: expected a folder that can be written", "No space left on device")


def test_a_bug_still_shows_its_traceback(tmp_path, monkeypatch):
    def bug(*args, **kwargs):
        raise RuntimeError("a bug")
    monkeypatch.setattr(trainer, "train", bug)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["train", "--set", f"output_dir={tmp_path / 'run'}"])


def test_a_missing_file_outside_the_run_directory_is_a_bug(tmp_path, monkeypatch):
    def missing_asset(*args, **kwargs):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/somewhere/else/tokenizer.json")
    monkeypatch.setattr(trainer, "train", missing_asset)
    with pytest.raises(FileNotFoundError):
        main(["train", "--set", f"output_dir={tmp_path / 'run'}"])


# ------------------------------------------------------------------ --debug, argparse, book

@pytest.mark.parametrize("argv", [["--debug", "train"], ["train", "--debug"]])
def test_debug_adds_the_traceback(capsys, tmp_path, argv):
    code = main(argv + ["--resume", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" in err and "UsageError" in err
    assert err.splitlines()[-1].startswith("grpo-edu train: --resume: expected a run directory")


def test_argparse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["train", "--bogus"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and len(err.splitlines()) == 1 and "--bogus" in err


def test_book_unknown_chapter(capsys):
    one_line_error(capsys, ["book", "check", "99"], "grpo-edu book: CHAPTER: chapter '99' is not in book.toml",
                   "known: 0 (00_from_reinforce_to_grpo), 1 (01_grpo_by_hand)")


def test_book_root_without_a_manifest(capsys, tmp_path):
    one_line_error(capsys, ["book", "--root", str(tmp_path), "list"], "--root: expected a folder holding book.toml",
                   str(tmp_path))


def test_book_manifest_that_is_not_toml(capsys, tmp_path):
    (tmp_path / "book.toml").write_text("[book\n")
    one_line_error(capsys, ["book", "--root", str(tmp_path), "list"],
                   f"--root {tmp_path}: expected book.toml to be valid TOML")


def test_book_manifest_that_is_inconsistent(capsys, tmp_path):
    (tmp_path / "book.toml").write_text('[book]\ntitle = "t"\ndescription = "d"\n')
    one_line_error(capsys, ["book", "--root", str(tmp_path), "list"],
                   f"--root {tmp_path}: book.toml needs at least one [[chapters]] entry")


def test_config_beside_resume_is_said_to_be_unused(capsys, tmp_path):
    run = a_run_dir(tmp_path)
    assert main(["train", "--config", "configs/cpu-tiny.toml", "--resume", str(run)]) == 2
    note, error = capsys.readouterr().err.splitlines()
    assert note.startswith("grpo-edu train: --config configs/cpu-tiny.toml is not used: a resumed run keeps its own")
    assert "expected a checkpoint" in error


def test_ctrl_c_says_how_to_continue(capsys, tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(trainer, "train", interrupted)
    assert main(["train", "--set", f"output_dir={tmp_path / 'run'}"]) == 130
    err = capsys.readouterr().err
    assert err == f"grpo-edu train: interrupted; continue from the newest checkpoint with grpo-edu train --resume {tmp_path / 'run'}\n"


def test_a_model_folder_without_config_json(capsys, tmp_path):
    one_line_error(capsys, ["train", "--set", f"model={tmp_path}", "--set", f"output_dir={tmp_path / 'run'}"],
                   "grpo-edu train: model: expected 'start', 'multiply-start', 'chain-start', 'trained', 'digitsum-start', "
                   "'digitsum-no-check' or 'digitsum-no-top-worked', a saved model folder", str(tmp_path), "no config.json")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_cuda_without_a_gpu(capsys, tmp_path):
    one_line_error(capsys, ["train", "--set", "device=cuda", "--set", f"output_dir={tmp_path / 'run'}"],
                   "grpo-edu train: device: expected a device this machine has, got 'cuda'")
