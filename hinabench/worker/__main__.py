"""`python -m hinabench.worker`: the worker loop (hinabench/worker/protocol.py)."""
import sys

from hinabench.worker.protocol import main

sys.exit(main())
