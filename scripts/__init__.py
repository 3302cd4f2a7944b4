"""Benchmarks and the load-test report jobs, each run from the checkout root as `python -m scripts.<name>`
(`.venv/bin/python -m scripts.producer_perf --help`); the editable install puts the checkout on the venv's
sys.path, so `scripts` imports from any directory. What they share is in scripts.harness."""
