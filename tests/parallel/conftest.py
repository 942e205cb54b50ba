"""tests/parallel/multidevice needs 8 host CPU devices, which XLA fixes when its CPU backend starts:
its modules run in their own pytest process (tests/parallel/test_multidevice.py starts one per
module with the flag set), never inside a session whose backend may have started already."""

import os

if os.environ.get("FP4RL_MULTIDEVICE") != "1":
    collect_ignore = ["multidevice"]
