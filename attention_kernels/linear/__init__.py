"""Linear attention ([IA] Eq. 1): triton.py (no softmax, optional 1/(visible keys))."""
