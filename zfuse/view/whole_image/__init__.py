"""The whole image as one file: an array (or an OME-Zarr pyramid) as a virtual tiled
OME-TIFF, `image.ome.tif` in every array directory and `pyramid.ome.tif` in every
OME-Zarr multiscale group directory.

The parts (each module's docstring says what it owns):

- `layout.py`: levels, tiles, planes, passthrough planning; where every IFD block
  and tile slot is (`FileLayout`), from metadata alone.
- `header.py`: the IFDs, written with the chunk files' IFD encoder (`view/tiff_ifd.py`).
- `ome.py`: the OME-XML, and the readers of OME-Zarr multiscales/omero attributes.
- `tiles.py`: the tile cache, decoded tiles (assembly) and passthrough reads.
- `push.py`: tiles pushed ahead of region readers, chunk files read ahead.
- `strips.py`: `StrippedImage`, `image.tif`: the array as a stripped classic TIFF
  laid out as ImageJ 1.x writes stacks (plain ImageJ reads no tiles).
- `slide.py`: whether a pyramid gets `slide.tif`, the OpenSlide layout (levels as
  successive tiled IFDs, RGB interleaved), and what its IFDs say (`SlideLayout`).
- `file.py`: `ImageFile`, the reads every whole-image file answers (from memory
  only, blocking, failing once the store changed under it).
- `image.py`: `WholeImage` tying them, the threads it uses (`ImageWorkers`, owned
  by the view) and which files a directory shows (`plan_whole_images`).

No FUSE here.
"""

from zfuse.view.tiff_ifd import COMPRESSION_DEFLATE, COMPRESSION_NONE
from zfuse.view.whole_image.image import (
    IMAGE_NAME,
    NAMES,
    PYRAMID_NAME,
    SLIDE_NAME,
    STRIPPED_NAME,
    ImageWorkers,
    WholeImage,
    plan_whole_images,
    pyramid_dataset_paths,
)
from zfuse.view.whole_image.layout import (
    MAX_FILE_SIZE,
    passthrough_compression,
    pyramid_levels,
    tile_edge,
)
from zfuse.view.whole_image.ome import (
    PlaneAxes,
    multiscale_name,
    multiscale_paths,
    ome_pixel_type,
    ome_xml,
    omero_channels,
    plane_axes,
)
from zfuse.view.whole_image.strips import StrippedImage
from zfuse.view.whole_image.tiles import StaleImageError

__all__ = [
    "COMPRESSION_DEFLATE",
    "COMPRESSION_NONE",
    "IMAGE_NAME",
    "MAX_FILE_SIZE",
    "NAMES",
    "PYRAMID_NAME",
    "SLIDE_NAME",
    "STRIPPED_NAME",
    "ImageWorkers",
    "PlaneAxes",
    "StaleImageError",
    "StrippedImage",
    "WholeImage",
    "multiscale_name",
    "multiscale_paths",
    "ome_pixel_type",
    "ome_xml",
    "omero_channels",
    "passthrough_compression",
    "plan_whole_images",
    "pyramid_dataset_paths",
    "plane_axes",
    "pyramid_levels",
    "tile_edge",
]
