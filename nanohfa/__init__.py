"""The library behind the scripts at the checkout's root (train.py, sample.py, compare.py, ...):
data, checkpoints, run folders, settings, grids and launchers, Hugging Face folders, lm-eval.
Importing the package imports nothing; each script imports the modules it needs."""
