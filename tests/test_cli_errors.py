"""Every command against bad input: exit status 2, one line on stderr naming the argument
and what to give instead, no traceback, and no output file left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenbatch.cli import main
from tokenbatch.cli.output import atomic_output


def _write_inputs(folder: Path) -> None:
    """Good and bad input files, named after what they hold."""
    np.save(folder / "good.npy", np.array([5, 3, 7]))
    np.save(folder / "float.npy", np.array([1.0, 2.0]))
    np.save(folder / "matrix.npy", np.ones((2, 2), dtype=np.int64))
    np.save(folder / "no-lengths.npy", np.zeros(0, dtype=np.int64))
    np.save(folder / "pickled.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (folder / "corrupt.npy").write_bytes(b"\x93NUMPY garbage")
    (folder / "text-as.npy").write_bytes(b"this is not numpy at all")
    (folder / "zero-bytes.npy").write_bytes(b"")
    (folder / "words.txt").write_text("1 2 three\n")
    (folder / "empty.txt").write_text("")
    (folder / "corrupt.parquet").write_bytes(b"PAR1 not really parquet")
    (folder / "zero-bytes.parquet").write_bytes(b"")
    pq.write_table(pa.table({"x": [1, 2, 3]}), folder / "no-token-lists.parquet")
    pq.write_table(pa.table({"input_ids": [[1, 2], [3]]}), folder / "tokens.parquet")
    (folder / "not-json.json").write_text("{not json")
    (folder / "binary.json").write_bytes(b"\xff\xfe\x00\x81")
    (folder / "list.json").write_text(json.dumps([1, 2]))
    config = {
        "model_type": "llama",
        "hidden_size": "wide",
        "num_attention_heads": 32,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "vocab_size": 100,
    }
    (folder / "wrong-types.json").write_text(json.dumps(config))
    (folder / "no-parquet").mkdir()


PLAN = "plan llama-3.1-8b --gpus 8"
MEMORY = "memory llama-3.1-8b"
PACK = "pack --example chat --n 100"
DATASET = "pack-dataset tokens.parquet out.parquet"
LINEAR = "schedule --linear 4096 8192 1T --total-tokens 2T"

#: (command line, a word the one-line message must contain)
CASES = [
    # pack: numbers
    (f"{PACK} --max-tokens 0", "--max-tokens"),
    (f"{PACK} --max-tokens -5", "--max-tokens"),
    (f"{PACK} --max-tokens nan", "--max-tokens"),
    (f"{PACK} --max-tokens inf", "--max-tokens"),
    (f"{PACK} --max-tokens 1e30", "--max-tokens"),
    (f"{PACK} --max-tokens 1e12", "max_tokens"),
    (f"{PACK} --max-tokens 8.5", "--max-tokens"),
    (f"{PACK} --max-tokens 8KB", "--max-tokens"),
    (f"{PACK} --n 0", "--n"),
    (f"{PACK} --max-seqs 0", "--max-seqs"),
    (f"{PACK} --pad-to-multiple-of 0", "--pad-to-multiple-of"),
    (f"{PACK} --pad-to-multiple-of 16 --max-tokens 8", "pad_to_multiple_of"),
    (f"{PACK} --seed -1", "--seed"),
    (f"{PACK} --seed 1.5", "--seed"),
    # pack: files
    ("pack missing.npy", "does not exist"),
    ("pack empty.txt", "no lengths"),
    ("pack zero-bytes.npy", "empty"),
    ("pack no-lengths.npy", "no lengths"),
    ("pack corrupt.npy", "not a valid .npy"),
    ("pack text-as.npy", "pickled"),
    ("pack pickled.npy", "pickled"),
    ("pack float.npy", "float64"),
    ("pack matrix.npy", "shape (2, 2)"),
    ("pack words.txt", "three"),
    ("pack no-parquet", "folder"),
    ("pack good.npy --output missing-folder/out.npz", "--output"),
    ("pack good.npy --output out.txt", "--output"),
    ("pack good.npy --max-tokens 4 --output out.npz", "oversize"),
    ("pack good.npy --max-tokens 4 --plot out.png", "oversize"),
    # pack-dataset
    ("pack-dataset missing.parquet out.parquet --max-tokens 64", "does not exist"),
    ("pack-dataset corrupt.parquet out.parquet --max-tokens 64", "not a readable Parquet"),
    ("pack-dataset zero-bytes.parquet out.parquet --max-tokens 64", "not a readable Parquet"),
    ("pack-dataset empty.txt out.parquet --max-tokens 64", "not a readable Parquet"),
    ("pack-dataset no-parquet out.parquet --max-tokens 64", "no .parquet files"),
    ("pack-dataset no-token-lists.parquet out.parquet --max-tokens 64", "token lists"),
    ("pack-dataset tokens.parquet out.csv --max-tokens 64", "output"),
    ("pack-dataset tokens.parquet missing-folder/out.parquet --max-tokens 64", "output"),
    (f"{DATASET} --max-tokens 0", "--max-tokens"),
    (f"{DATASET} --max-tokens 4GB", "--max-tokens"),
    (f"{DATASET} --max-tokens nan", "--max-tokens"),
    (f"{DATASET} --max-tokens 1 --oversize error", "oversize"),
    (f"{DATASET} --max-tokens 64 --columns nosuch", "nosuch"),
    (f"{DATASET} --max-tokens 64 --max-seqs -2", "--max-seqs"),
    # memory
    (f"{MEMORY} --seq-len 0", "--seq-len"),
    (f"{MEMORY} --seq-len -1", "--seq-len"),
    (f"{MEMORY} --seq-len nan", "--seq-len"),
    (f"{MEMORY} --seq-len 4096.5", "--seq-len"),
    (f"{MEMORY} --seq-len 4KB", "--seq-len"),
    (f"{MEMORY} --seq-len 1e30", "--seq-len"),
    (f"{MEMORY} --seq-len 1e308", "--seq-len"),
    (f"{MEMORY} --pp 4 --first-stage-layers 0", "--first-stage-layers"),
    (f"{MEMORY} --pp 4 --first-stage-layers -2", "--first-stage-layers"),
    (f"{MEMORY} --pp 4 --last-stage-layers 7.5", "--last-stage-layers"),
    (f"{MEMORY} --pp 4 --last-stage-layers many", "--last-stage-layers"),
    (f"{MEMORY} --pp 4 --first-stage-layers 40", "first_stage_layers=40"),
    (f"{MEMORY} --pp 4 --first-stage-layers 7", "do not split over pp"),
    (f"{MEMORY} --first-stage-layers 8", "with pp > 1"),
    (f"{MEMORY} --pp 4 --pipeline-split uneven", "--pipeline-split"),
    (f"{MEMORY} --pp 3", "pipeline_split='auto'"),
    ("memory mixtral-8x7b --moe-capacity-factor 1e308", "exceeds the range of a float"),
    (f"{MEMORY} --dp 0", "--dp"),
    (f"{MEMORY} --gpu-memory 80", "--gpu-memory"),
    (f"{MEMORY} --gpu-memory 80G", "--gpu-memory"),
    (f"{MEMORY} --gpu-memory nanGB", "--gpu-memory"),
    (f"{MEMORY} --gpu-memory=-1GB", "--gpu-memory"),
    (f"{MEMORY} --tp 3", "tp must divide"),
    (f"{MEMORY} --zero 5", "--zero"),
    (f"{MEMORY} --optimizer nosuch", "optimizer"),
    (f"{MEMORY} --plot missing-folder/x.png", "--plot"),
    (f"{MEMORY} --optimizer-offload 1.5", "--optimizer-offload"),
    (f"{MEMORY} --optimizer-offload -0.5", "--optimizer-offload"),
    (f"{MEMORY} --cp-comm ring", "--cp-comm"),
    (f"{MEMORY} --implementation megatron", "--implementation"),
    (f"{MEMORY} --moe-dispatcher all_gather", "--moe-dispatcher"),
    (f"{MEMORY} --moe-capacity-factor 0", "--moe-capacity-factor"),
    (f"{MEMORY} --mtp-layers -1", "--mtp-layers"),
    (f"{MEMORY} --optimizer-dtype fp64", "optimizer_dtype"),
    ("memory missing-folder/config.json", "preset"),
    ("memory not-json.json", "not valid JSON"),
    ("memory binary.json", "config.json"),
    ("memory list.json", "config"),
    ("memory wrong-types.json", "hidden_size"),
    # plan
    (f"{PLAN} --gpu-memory 80GB --seq-len 0", "--seq-len"),
    (f"{PLAN} --gpus 0", "--gpus"),
    (f"{PLAN} --gpus 1e30", "--gpus"),
    (f"{PLAN} --gpus 2.5", "--gpus"),
    (f"{PLAN} --gpu-memory 80", "--gpu-memory"),
    (f"{PLAN} --gpu-memory 80Gi", "--gpu-memory"),
    (f"{PLAN} --global-batch-tokens 4GB", "--global-batch-tokens"),
    (f"{PLAN} --global-batch-tokens 0", "--global-batch-tokens"),
    (f"{PLAN} --peak-tflops nan", "--peak-tflops"),
    (f"{PLAN} --peak-tflops -1", "--peak-tflops"),
    (f"{PLAN} --peak-tflops inf", "--peak-tflops"),
    (f"{PLAN} --top 0", "--top"),
    (f"{PLAN} --hardware tpu-v5", "--hardware"),
    ("plan llama-3.1-8b", "--gpus"),
    # schedule
    ("schedule --preset deepseek-v3 --dp 0", "--dp"),
    ("schedule --preset deepseek-v3 --dp nan", "--dp"),
    ("schedule --linear 0 10 100 --total-tokens 1T", "start"),
    ("schedule --linear 4096 8192 1T --total-tokens 1.5", "--total-tokens"),
    ("schedule --linear 4096 8192 1T --total-tokens 4GB", "--total-tokens"),
    ("schedule --linear 4096 8192 1T --total-tokens 1e30", "--total-tokens"),
    ("schedule --linear 4096 8192 1T --total-tokens 0", "--total-tokens"),
    (f"{LINEAR} --seq-len 0", "--seq-len"),
    ("schedule --preset deepseek-v3 --lr nan", "--lr"),
    ("schedule --preset deepseek-v3 --lr -1", "--lr"),
    ("schedule --preset deepseek-v3 --lr 1e-3 --min-lr inf", "--min-lr"),
    ("schedule --preset deepseek-v3 --steps --every 0", "--every"),
    ("schedule --preset deepseek-v3 --output x.txt", "--output"),
    ("schedule --preset deepseek-v3 --output missing-folder/x.csv", "--output"),
    ("schedule --megatron 32 32 1000 1000 --seq-len 2048 --total-tokens 1B", "increment"),
    ("schedule --megatron 32 32 1000 1024 --total-tokens 1B --output t.csv", "seq_len"),
    ("schedule --piecewise 0:4Mi 100:nan --total-tokens 1T", "--piecewise"),
    ("schedule --piecewise 0:4Mi 100 --total-tokens 1T", "--piecewise"),
    ("schedule --recommend 7B", "--total-tokens"),
    ("schedule --recommend 7GB --total-tokens 1T", "--recommend"),
    ("schedule --recommend 7GB --law step --total-tokens 1T", "--recommend"),
    ("schedule --recommend 7B --total-tokens 1T --gpu-memory 80G", "--gpu-memory"),
    ("schedule --recommend 7B --total-tokens 1T --gpus 0", "--gpus"),
    ("schedule --linear 4096 8192 1T --total-tokens 1e18 --output t.npz", "steps"),
    (
        "schedule --linear 12288 24576 1B --total-tokens 2B --dp 3 --micro-batch-tokens 4096 "
        "--multiple-of 1 --output t.npz",
        "multiple",
    ),
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("inputs")
    _write_inputs(folder)
    return folder


def _contents(folder: Path) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*")}


@pytest.mark.parametrize(("command", "named"), CASES, ids=[case[0] for case in CASES])
def test_bad_input_is_one_line_and_exit_status_2(
    command: str,
    named: str,
    inputs: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(inputs)
    before = _contents(inputs)
    try:
        code = main(command.split())
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured.err
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"tokenbatch {command.split()[0]}: error: "), lines[0]
    assert named in lines[0], lines[0]
    assert "Traceback" not in captured.err
    assert captured.out == ""
    assert _contents(inputs) == before, "an output file was left behind"


def test_the_installed_command_exits_2_without_a_traceback(inputs: Path) -> None:
    """The same, through the real process (the example the review found)."""
    for command in [
        "plan llama-3.1-8b --gpus 8 --gpu-memory 80GB --seq-len 0",
        "pack pickled.npy --output out.npz",
    ]:
        result = subprocess.run(
            [sys.executable, "-m", "tokenbatch.cli", *command.split()],
            cwd=inputs,
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "Traceback" not in result.stderr
    assert not (inputs / "out.npz").exists()


def test_a_write_that_fails_midway_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "table.npz"

    def interrupted_write() -> None:
        with atomic_output(target) as partial:
            partial.write_bytes(b"half a file")
            raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        interrupted_write()
    assert list(tmp_path.iterdir()) == []
    with atomic_output(target) as partial:
        partial.write_bytes(b"all of it")
    assert [p.name for p in tmp_path.iterdir()] == ["table.npz"]
    assert target.read_bytes() == b"all of it"


def test_pack_dataset_on_tokens_writes_its_output(inputs: Path, tmp_path: Path) -> None:
    """The good file of the table packs (the refusals above are not of everything)."""
    out = tmp_path / "packed.parquet"
    source = str(inputs / "tokens.parquet")
    assert main(["pack-dataset", source, str(out), "--max-tokens", "4"]) == 0
    assert pq.read_table(out).num_rows == 1
