"""Builds dopt's C++ core (the extension dopt._C) with CMake from this
checkout, for `pip install ./python` (metadata in pyproject.toml).

Settings (environment):
  DOPT_CMAKE_ARGS   more arguments for CMake's configure step
  DOPT_BUILD_JOBS   parallel build jobs (default: the CPUs, at most 8)
  DOPT_PREBUILT     a dopt build folder whose python/dopt/_C*.so to package
                    as it is, instead of building (the CTest uses this)
  DOPT_PIP_BUILD_DIR the CMake build folder (default: build-pip/ in the
                    checkout, beside build/, so that ccache finds the objects
                    of a build/ made with the same options)
A second install rebuilds only what changed; CMake follows
CMAKE_CXX_COMPILER_LAUNCHER (e.g. ccache) from the environment.
"""
import glob
import os
import pathlib
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        target = pathlib.Path(self.get_ext_fullpath(ext.name)).resolve()
        prebuilt = os.environ.get("DOPT_PREBUILT")
        if prebuilt:
            found = glob.glob(os.path.join(prebuilt, "python", "dopt", "_C*.so"))
            if not found:
                raise SystemExit(f"setup.py: DOPT_PREBUILT={prebuilt} has no python/dopt/_C*.so")
            built = pathlib.Path(found[0])
        else:
            built = self._cmake_build()
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)

    def _cmake_build(self):
        if not (ROOT / "CMakeLists.txt").exists():
            raise SystemExit(f"setup.py: {ROOT} is not a dopt checkout (no CMakeLists.txt): build from the checkout")
        build = pathlib.Path(os.environ.get("DOPT_PIP_BUILD_DIR") or ROOT / "build-pip").resolve()
        jobs = os.environ.get("DOPT_BUILD_JOBS") or str(min(8, os.cpu_count() or 1))
        configure = ["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                     "-DDOPT_ENABLE_TESTS=OFF", "-DDOPT_ENABLE_BENCH=OFF", "-DDOPT_ENABLE_EXAMPLES=OFF",
                     "-DDOPT_ENABLE_LIBTORCH=OFF", "-DDOPT_ENABLE_PYTHON=ON",
                     f"-DPython3_EXECUTABLE={sys.executable}"]
        configure += shlex.split(os.environ.get("DOPT_CMAKE_ARGS", ""))
        print("setup.py: " + " ".join(configure), flush=True)
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build), "--target", "dopt_python", "-j", jobs], check=True)
        found = glob.glob(str(build / "python" / "dopt" / "_C*.so"))
        if not found:
            raise SystemExit(f"setup.py: the build in {build} made no python/dopt/_C*.so")
        return pathlib.Path(found[0])


setup(ext_modules=[Extension("dopt._C", sources=[])], cmdclass={"build_ext": CMakeBuild})
