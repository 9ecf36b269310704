"""Make the repository root importable (model.py, kernels/) however pytest is invoked, and
load the kernels package first: on a machine without CUDA it imports triton with the
interpreter on (for that import only), which must happen before anything else imports
triton, so that the Triton kernels can be tested on CPU tensors."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernels  # noqa: E402

kernels.load_triton()
