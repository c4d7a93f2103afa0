"""The mounted view without FUSE: a tree of groups, arrays and chunk files, and
the bytes of each chunk file (generated TIFF header + decoded pixels)."""
