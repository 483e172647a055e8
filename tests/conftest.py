import os
import signal

import pytest
import torch

# A test run started in the background of a non-interactive shell (`cmd &`) inherits SIGINT ignored,
# and so would every CLI it starts: the Ctrl-C tests (test_faults, test_fleet) then timed out or
# skipped. A handler here makes the children start with the default disposition (exec resets a
# handler to the default; an ignored signal stays ignored).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Tests must not fight each other for the two cores; one thread keeps them predictable.
torch.set_num_threads(int(os.environ.get("HINABENCH_TEST_THREADS", "1")))


@pytest.fixture
def tmp_results(tmp_path):
    return tmp_path / "results.csv"
