# The Python package (python/, docs/PYTHON.md): `import bevformer`, a pybind11 module over the
# static libraries. On by default where Python 3's headers and pybind11 are found, off under the
# sanitizers and the fuzz build.
#
# Which interpreter: Debian's /usr/bin/python3 unless told otherwise (-DPython3_EXECUTABLE=...;
# pip/scikit-build-core passes its own). scripts/setup.sh installs numpy, pybind11 and pytest for
# that one; an interpreter first on PATH (pyenv, conda) may lack them.
if(NOT DEFINED Python3_EXECUTABLE AND NOT DEFINED SKBUILD AND EXISTS /usr/bin/python3)
  set(Python3_EXECUTABLE /usr/bin/python3)
endif()

set(_bev_python_default OFF)
set(_bev_python_why "")
if(BEV_SANITIZE OR BEV_FUZZ)
  # An extension built with ASan only loads into a python3 that has libasan preloaded; the
  # package is tested in the release build instead.
  set(_bev_python_why "not under the sanitizers (an ASan extension needs libasan preloaded into python3)")
else()
  find_package(Python3 3.9 COMPONENTS Interpreter Development.Module QUIET)
  if(Python3_FOUND)
    find_package(pybind11 2.10 CONFIG QUIET)
    if(NOT pybind11_FOUND)
      # pybind11 from pip (a venv, or pip's isolated build environment) says where its CMake files are.
      execute_process(COMMAND ${Python3_EXECUTABLE} -m pybind11 --cmakedir OUTPUT_VARIABLE _bev_pybind11_dir
                      OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _bev_pybind11_rc)
      if(_bev_pybind11_rc EQUAL 0)
        find_package(pybind11 2.10 CONFIG QUIET PATHS ${_bev_pybind11_dir} NO_DEFAULT_PATH)
      endif()
    endif()
    if(pybind11_FOUND)
      set(_bev_python_default ON)
    else()
      set(_bev_python_why "pybind11 not found (Debian: pybind11-dev python3-pybind11; scripts/setup.sh installs them)")
    endif()
  else()
    set(_bev_python_why "no Python 3 development headers (Debian: python3-dev)")
  endif()
endif()
option(BEV_PYTHON "Build the Python package (import bevformer)" ${_bev_python_default})
if(BEV_PYTHON AND NOT pybind11_FOUND)
  message(FATAL_ERROR "BEV_PYTHON is ON but ${_bev_python_why}")
endif()
if(BEV_PYTHON)
  message(STATUS "bevformer: Python package for ${Python3_EXECUTABLE} (${Python3_VERSION}), pybind11 ${pybind11_VERSION}")
  # The module is a shared object made of the static libraries, so everything is compiled as
  # position-independent code. -fno-semantic-interposition keeps GCC inlining and optimizing
  # calls between our own functions as it does for the executables (-fPIE); without it -fPIC
  # assumes any global function may be replaced at load time.
  set(CMAKE_POSITION_INDEPENDENT_CODE ON)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fno-semantic-interposition>)
  endif()
else()
  message(STATUS "bevformer: no Python package: ${_bev_python_why}")
endif()
