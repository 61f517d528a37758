"""MkDocs hook: ship MathJax with the site, taken from the npm registry at build time.

The pages load ``javascripts/mathjax/tex-chtml.js`` from the site itself, so formulas render
without a network. At build time the pinned release is fetched once with ``npm pack``, its
tarball checked against the registry's published sha512 integrity, and the parts the pages need
(the TeX-to-CommonHTML component, the TeX extensions it may autoload, its fonts and menu) are
unpacked into a cache (``.cache/mathjax/<version>/``, ignored by git). Later builds use the
cache and need no network. Nothing of MathJax is committed to the repository.

Without ``npm`` and without a cached copy the build warns (so ``mkdocs build --strict`` fails)
and the formulas would show as TeX source. Set ``L0BAYES_DOCS_WITHOUT_MATHJAX=1`` to build such
a site anyway (the test suite does, on machines without npm).
"""

import base64
import hashlib
import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.mathjax")

VERSION = "3.2.2"
# `npm view mathjax@3.2.2 dist.integrity`: the registry's checksum of the release tarball.
INTEGRITY = "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw=="
# What the pages use, relative to the package's es5/ directory.
PARTS = ("tex-chtml.js", "input/tex", "output/chtml", "ui", "a11y", "adaptors", "core.js", "startup.js", "loader.js")
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "mathjax" / VERSION
TARGET = "javascripts/mathjax"  # inside the site; mkdocs.yml lists TARGET/tex-chtml.js

_state = {"source": None}


def _integrity(path):
    digest = hashlib.sha512(Path(path).read_bytes()).digest()
    return "sha512-" + base64.b64encode(digest).decode()


def _fetch(cache):
    """``npm pack`` the pinned release, check it, and unpack the needed parts into ``cache``."""
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [npm, "pack", f"mathjax@{VERSION}", "--pack-destination", tmp, "--silent"],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
        tarball = Path(tmp) / f"mathjax-{VERSION}.tgz"
        got = _integrity(tarball)
        if got != INTEGRITY:
            raise RuntimeError(f"mathjax-{VERSION}.tgz has integrity {got}, the registry published {INTEGRITY}")
        staging = Path(tmp) / "staging"
        wanted = tuple(f"package/es5/{part}" for part in PARTS)
        with tarfile.open(tarball) as tar:
            for member in tar.getmembers():
                # regular files only, at a path we expect: no links, nothing outside the staging dir
                name = member.name
                if not member.isfile() or ".." in Path(name).parts or name.startswith("/"):
                    continue
                if name == "package/LICENSE":
                    relative = "LICENSE"
                elif any(name == w or name.startswith(w + "/") for w in wanted):
                    relative = name[len("package/es5/") :]
                else:
                    continue
                out = staging / relative
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(tar.extractfile(member).read())
        if not (staging / "tex-chtml.js").is_file():
            raise RuntimeError(f"mathjax-{VERSION}.tgz has no es5/tex-chtml.js")
        cache.parent.mkdir(parents=True, exist_ok=True)
        if cache.exists():  # an incomplete earlier attempt
            shutil.rmtree(cache)
        shutil.move(staging, cache)


def on_config(config):
    """Make sure MathJax is in the cache before the pages are built (fetch it if needed)."""
    _state["source"] = None
    if not (CACHE / "tex-chtml.js").is_file():
        try:
            _fetch(CACHE)
        except (RuntimeError, OSError, subprocess.SubprocessError) as err:
            detail = getattr(err, "stderr", None) or err
            message = (
                f"MathJax {VERSION} could not be fetched from the npm registry ({detail}); "
                "formulas will show as TeX source. Install npm and build once with a network."
            )
            if os.environ.get("L0BAYES_DOCS_WITHOUT_MATHJAX") == "1":
                log.info(message)
            else:
                log.warning(message)
            return config
    _state["source"] = CACHE
    return config


def on_post_build(config):
    """Copy the cached MathJax into the built site."""
    if _state["source"] is None:
        return
    target = Path(config["site_dir"]) / TARGET
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(_state["source"], target)
