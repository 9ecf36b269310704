"""HyperAttention ([IA] Def 6.1, App. F): pytorch.py (blockwise order 3, the materialising
reference for any order, linear HA), triton.py (order 3 in Triton)."""
