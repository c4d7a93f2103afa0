"""Side-by-side speed figures for zfuse (`python -m benchmarks.run`); see README.md."""
