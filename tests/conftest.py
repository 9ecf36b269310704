"""Make the repository root importable (model.py, hyperattention.py) however pytest is invoked."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
