"""The Zarr extension proposals for zarr-python 3 (no FUSE, no TIFF here)."""
