import os

import pytest
import torch

# Tests must not fight each other for the two cores; one thread keeps them predictable.
torch.set_num_threads(int(os.environ.get("HINABENCH_TEST_THREADS", "1")))


@pytest.fixture
def tmp_results(tmp_path):
    return tmp_path / "results.csv"
