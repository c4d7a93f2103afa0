"""Physical units of OME-Zarr axes: one table for every file that states them.

OME-Zarr names units as UDUNITS-2 does ("nanometer", "millisecond"; the spec lists
which); writers also put OME's symbols ("nm", "µm", "ms") or "micron" and "um".
A unit is known here with its OME symbol (OME-XML's `PhysicalSizeXUnit`,
`TimeIncrementUnit`) and its size in micrometres or seconds: ImageJ descriptions
and TIFF resolutions state lengths in micrometres and times in seconds, because
Bio-Formats (Fiji's importer, QuPath) reads an ImageJ TIFF's calibration so,
whatever unit its description names. A unit not known here is never guessed:
a size in it is left out where a reader would take it for micrometres or seconds.

Text and numbers only: no TIFF, no store, no FUSE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Unit:
    kind: str  # "length" or "time"
    ome: str  # OME's symbol (UnitsLength, UnitsTime)
    size: float  # in micrometres (length) or seconds (time)


_SI = (("yotta", "Y", 24), ("zetta", "Z", 21), ("exa", "E", 18), ("peta", "P", 15), ("tera", "T", 12),
       ("giga", "G", 9), ("mega", "M", 6), ("kilo", "k", 3), ("hecto", "h", 2), ("deca", "da", 1),
       ("", "", 0), ("deci", "d", -1), ("centi", "c", -2), ("milli", "m", -3), ("micro", "\u00b5", -6),
       ("nano", "n", -9), ("pico", "p", -12), ("femto", "f", -15), ("atto", "a", -18), ("zepto", "z", -21),
       ("yocto", "y", -24))


def _table() -> tuple[dict[str, Unit], dict[str, Unit]]:
    """(units by lower-case name, units by exact symbol)."""
    names: dict[str, Unit] = {}
    symbols: dict[str, Unit] = {}
    for prefix, symbol, power in _SI:
        length = Unit("length", symbol + "m", 10.0 ** (power + 6))
        time = Unit("time", symbol + "s", 10.0**power)
        names[prefix + "meter"] = names[prefix + "metre"] = symbols[length.ome] = length
        names[prefix + "second"] = symbols[time.ome] = time
    names["dekameter"] = names["decameter"]
    for name, ome, microns in (("angstrom", "\u00c5", 1e-4), ("inch", "in", 25400.0), ("foot", "ft", 304800.0),
                               ("yard", "yd", 914400.0), ("mile", "mi", 1609344000.0),
                               ("parsec", "pc", 3.0856775814913673e22)):
        names[name] = symbols[ome] = Unit("length", ome, microns)
    for name, ome, seconds in (("minute", "min", 60.0), ("hour", "h", 3600.0), ("day", "d", 86400.0)):
        names[name] = symbols[ome] = Unit("time", ome, seconds)
    # other spellings writers use: ImageJ's, ASCII and Greek mu for micro, "sec"
    micron, microsecond = symbols["\u00b5m"], symbols["\u00b5s"]
    for alias in ("micron", "um", "\u03bcm"):
        names[alias] = micron
    for alias in ("us", "\u03bcs"):
        names[alias] = microsecond
    for alias in ("sec", "secs"):
        names[alias] = symbols["s"]
    names["\u00e5"] = symbols["\u00c5"]
    return names, symbols


_BY_NAME, _BY_SYMBOL = _table()


def unit_of(text: object) -> Unit | None:
    """The unit `text` names (a name in any case, plural or not, or OME's symbol in its
    own case: "Mm" is a megametre, "mm" a millimetre); None if not known."""
    if not isinstance(text, str) or not text or len(text) > 32:
        return None
    found = _BY_SYMBOL.get(text.strip())
    if found is not None:
        return found
    name = text.strip().lower()
    found = _BY_NAME.get(name)
    if found is None and name.endswith("s"):
        found = _BY_NAME.get(name[:-1])  # "micrometers", "seconds", "microns"
    return found


def in_unit_size(value: object, text: object, kind: str) -> float | None:
    """`value` of unit `text` in micrometres (`kind` "length") or seconds ("time");
    None when the unit is not known as that kind, or the result is no positive
    finite number."""
    unit = unit_of(text)
    if unit is None or unit.kind != kind:
        return None
    try:
        out = float(value) * unit.size  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return out if math.isfinite(out) and out > 0 else None


def micrometres(value: object, text: object) -> float | None:
    return in_unit_size(value, text, "length")


def seconds(value: object, text: object) -> float | None:
    return in_unit_size(value, text, "time")
