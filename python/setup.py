"""zero's Python package as a wheel, built against the torch of the Python
that runs pip (its LibTorch is zero's):

    .venv/bin/pip install --no-build-isolation ./python

(--no-build-isolation: the build needs this environment's torch, not a
fresh one). It configures zero's CMake build in ZERO_BUILD_DIR (default
build-wheel, the folder `ZERO_TORCH=wheel bash tools/build.sh` uses, so an
existing build is reused), builds the zero_python target and installs its
`python` component: the package, zero._C and the libraries it links.
"""
import os
import re
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(*command):
    print("zero:", " ".join(command), flush=True)
    subprocess.run(command, check=True)


BUILD = os.environ.get("ZERO_BUILD_DIR") or os.path.join(ROOT, "build-wheel")
if not os.path.isabs(BUILD):  # pip runs this file in its own folder, not the caller's
    sys.exit(f"zero: ZERO_BUILD_DIR={BUILD} is relative; give it as an absolute path")
SETUPTOOLS_DIR = os.path.join(BUILD, "python-setuptools")  # setuptools' own folders, out of the source tree
os.makedirs(SETUPTOOLS_DIR, exist_ok=True)


class BuildWithCMake(build_py):
    def run(self):
        build = BUILD
        python = os.path.abspath(sys.executable)
        cache = os.path.join(build, "CMakeCache.txt")
        if os.path.exists(cache):
            with open(cache) as f:
                had = next((l.split("=", 1)[1].strip() for l in f if l.startswith("ZERO_TORCH_PYTHON:")), "")
            # The same environment (pip runs it as python3, the build may name it python).
            if os.path.dirname(had) != os.path.dirname(python):
                sys.exit(f"zero: {build} was configured for the torch of {had or 'no Python (Debian LibTorch)'}, not "
                         f"{python}'s; set ZERO_BUILD_DIR to another folder")
        else:
            run("cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                f"-DZERO_TORCH_PYTHON={python}")
        run("cmake", "--build", build, "--target", "zero_python", "-j", str(os.cpu_count() or 2))
        run("cmake", "--install", build, "--component", "python", "--prefix", os.path.abspath(self.build_lib), "--strip")
        keep_sonames_only(os.path.join(self.build_lib, "zero"))


def keep_sonames_only(folder):
    """A wheel stores a symbolic link as a copy: libzero.so, libzero.so.0 and
    libzero.so.0.1.0 would be three copies of one library. The loader needs
    only the name zero._C asks for (the SONAME, libzero.so.0)."""
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.islink(path):
            os.unlink(path)
    for name in os.listdir(folder):
        soname = re.match(r"(lib\w+\.so\.\d+)\.\d+\.\d+$", name)
        if soname:
            os.replace(os.path.join(folder, name), os.path.join(folder, soname.group(1)))


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True  # zero._C: a wheel for this platform and Python


setup(name="zero", version="0.1.0", description="DeepSpeed's ZeRO in C++, from Python", python_requires=">=3.9",
      cmdclass={"build_py": BuildWithCMake}, distclass=BinaryDistribution, packages=["zero"], zip_safe=False,
      options={"build": {"build_base": SETUPTOOLS_DIR}, "egg_info": {"egg_base": SETUPTOOLS_DIR}})
