"""The CUDA truth campaign: what a GPU really allocates, measured in one prepared run (see campaign.py)."""
