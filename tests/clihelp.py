"""What the CLI tests share: a fast ffn sweep's options and click's runner."""
import csv

from click.testing import CliRunner

from hinabench.cli import cli

FAST = ["--model", "qwen3-30b-a3b", "--backends", "torch", "--rounds", "1", "--min-time", "0.01",
        "--warmup", "1", "--threads", "1"]


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
