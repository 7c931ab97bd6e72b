"""Builds the `uattn` extension module for pip. Where the library comes from, first match wins:
  1. UATTN_PREFIX=/opt/uattn: an installed uattn (`make install PREFIX=...`), through its pkg-config file;
  2. `pkg-config uattn` as the system finds it;
  3. this checkout: include/ and the shared library of UATTN_BUILD_DIR, else of ../build or ../build-py
     (run `make` first).
The module records the library's directory as its run path, so no LD_LIBRARY_PATH is needed later."""
import atexit
import glob
import os
import re
import shutil
import subprocess
import tempfile

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def pkg_config(*args):
    env = dict(os.environ)
    prefix = os.environ.get("UATTN_PREFIX")
    if prefix:
        dirs = [os.path.join(prefix, d, "pkgconfig") for d in ("lib", "lib64", "lib/x86_64-linux-gnu")]
        env["PKG_CONFIG_PATH"] = os.pathsep.join(dirs + [env.get("PKG_CONFIG_PATH", "")])
    try:
        return subprocess.run(["pkg-config", *args, "uattn"], env=env, check=True, capture_output=True,
                              text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return None


def from_pkg_config():
    cflags, libdirs, version = pkg_config("--cflags"), pkg_config("--variable=libdir"), pkg_config("--modversion")
    if cflags is None or not libdirs or not version:
        if os.environ.get("UATTN_PREFIX"):
            raise SystemExit(f"uattn: no uattn.pc under UATTN_PREFIX={os.environ['UATTN_PREFIX']}")
        return None
    libdirs = [os.path.normpath(d) for d in libdirs]  # the .pc file is relocatable: prefix/lib/pkgconfig/../..
    return dict(include_dirs=[os.path.normpath(f[2:]) for f in cflags if f.startswith("-I")], library_dirs=libdirs,
                runtime_library_dirs=libdirs, libraries=["uattn"]), version[0]


def from_build_tree():
    header = os.path.join(ROOT, "include", "uattn.h")
    # pip runs this file from a copy or from python/, not from where it was called: a relative
    # UATTN_BUILD_DIR is taken relative to the checkout's root
    candidates = [os.path.join(ROOT, os.environ["UATTN_BUILD_DIR"])] if os.environ.get("UATTN_BUILD_DIR") else \
        [os.path.join(ROOT, "build"), os.path.join(ROOT, "build-py")]
    for build in candidates:
        if os.path.exists(header) and os.path.exists(os.path.join(build, "libuattn.so")):
            text = open(header).read()
            version = ".".join(re.search(rf"#define UATTN_VERSION_{p} (\d+)", text).group(1)
                               for p in ("MAJOR", "MINOR", "PATCH"))
            build = os.path.abspath(build)
            return dict(include_dirs=[os.path.dirname(header)], library_dirs=[build], runtime_library_dirs=[build],
                        libraries=["uattn"]), version
    raise SystemExit("uattn: no installed libuattn (pkg-config uattn, or UATTN_PREFIX) and no built one in "
                     f"{' or '.join(candidates)}: run `make` (or `make install PREFIX=...`) first")


flags, version = from_pkg_config() or from_build_tree()
build_base = tempfile.mkdtemp(prefix="uattn-build-")
atexit.register(shutil.rmtree, build_base, True)
setup(
    version=version,
    # a fresh build directory each time: setuptools would otherwise reuse an earlier module, linked
    # against another libuattn, since its source did not change (and it keeps the source tree clean)
    options={"build": {"build_base": build_base}},
    ext_modules=[Extension("uattn", sources=sorted(glob.glob(os.path.join("src", "*.c"))),
                           extra_compile_args=["-std=c11", "-O2"], **flags)],
)
