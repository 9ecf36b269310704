"""HyperFeatureAttention ([IA] Def 5.1, Def E.2): triton.py (A = 1..4 score tiles, one softmax)."""
