# Finds the dependencies and turns each optional one into TPSCOPE_HAVE_<X>.
# A part that is ON (the default) but cannot be built is a configure error naming the Debian packages it needs:
# a build never goes green with a part silently left out. Turn the part OFF explicitly to build without it.
# CUDA is the exception by nature: TPSCOPE_WITH_CUDA=AUTO (the default) builds NVTX/CUPTI when the toolkit is found;
# ON makes a missing toolkit an error too.
find_package(SQLite3 REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(fmt REQUIRED)
find_package(ZLIB REQUIRED)
find_package(Threads REQUIRED)

if(CMAKE_CXX_COMPILER_LAUNCHER STREQUAL "")
  unset(CMAKE_CXX_COMPILER_LAUNCHER)
endif()
if(NOT DEFINED CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(TPSCOPE_CCACHE ccache)
  if(TPSCOPE_CCACHE)
    set(CMAKE_C_COMPILER_LAUNCHER ${TPSCOPE_CCACHE})
    set(CMAKE_CXX_COMPILER_LAUNCHER ${TPSCOPE_CCACHE})
  endif()
endif()

set(TPSCOPE_HAVE_TORCH OFF)
if(TPSCOPE_WITH_TORCH)
  find_package(Torch QUIET)
  if(Torch_FOUND)
    set(TPSCOPE_HAVE_TORCH ON)
  else()
    message(FATAL_ERROR "TPSCOPE_WITH_TORCH=ON but LibTorch was not found. Install the Debian packages "
                        "libtorch-dev libgloo-dev (./scripts/setup does), or pass -DCMAKE_PREFIX_PATH=<torch>/share/cmake, "
                        "or build without the engine: -DTPSCOPE_WITH_TORCH=OFF")
  endif()
endif()

set(TPSCOPE_HAVE_CUDA OFF)
if(TPSCOPE_WITH_CUDA)  # AUTO and ON
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND TARGET CUDA::cupti)
    set(TPSCOPE_HAVE_CUDA ON)
  elseif(TPSCOPE_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TPSCOPE_WITH_CUDA=ON but the CUDA toolkit with CUPTI was not found "
                        "(use -DTPSCOPE_WITH_CUDA=AUTO to build NVTX/CUPTI only where it is)")
  endif()
endif()

# The Python package is built for ONE interpreter, the one whose PyTorch it instruments: Debian's /usr/bin/python3
# (python3-torch lives in its dist-packages) unless -DTPSCOPE_PYTHON=<interpreter> says otherwise — not whatever
# python3 comes first on PATH (a pyenv or venv without torch).
set(TPSCOPE_HAVE_PYTHON OFF)
set(TPSCOPE_HAVE_PYTHON_AUTOGRAD OFF)
if(TPSCOPE_WITH_PYTHON)
  if(NOT TPSCOPE_PYTHON AND EXISTS /usr/bin/python3)
    set(TPSCOPE_PYTHON /usr/bin/python3)
  endif()
  set(TPSCOPE_PYTHON "${TPSCOPE_PYTHON}" CACHE FILEPATH "Python interpreter the tpscope package is built and tested for")
  set(_py_missing "")
  if(TPSCOPE_PYTHON)
    set(Python3_EXECUTABLE "${TPSCOPE_PYTHON}")
    find_package(Python3 QUIET COMPONENTS Interpreter Development.Module)
  endif()
  if(NOT Python3_Development.Module_FOUND)
    list(APPEND _py_missing python3-dev)
  endif()
  # pybind11's CMake package is looked for only once that interpreter is found: without it, pybind11 goes looking for
  # a Python of its own (a pyenv shim on PATH) and stops the configure with its own error.
  find_path(TPSCOPE_PYBIND11_INCLUDE pybind11/pybind11.h)
  if(NOT TPSCOPE_PYBIND11_INCLUDE)
    list(APPEND _py_missing pybind11-dev)
  endif()
  if(Python3_Interpreter_FOUND)
    # That PyTorch's version, folder and C++ ABI: tpscope._autograd is built against its headers and libraries.
    execute_process(COMMAND ${Python3_EXECUTABLE} -c "import os, torch, torch.distributed; print(torch.__version__); \
print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
                    OUTPUT_VARIABLE _py_torch_out OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE _py_torch ERROR_QUIET)
    if(NOT _py_torch EQUAL 0)
      list(APPEND _py_missing python3-torch)
    else()
      string(REPLACE "\n" ";" _py_torch_out "${_py_torch_out}")
      list(GET _py_torch_out 0 TPSCOPE_PYTHON_TORCH_VERSION)
      list(GET _py_torch_out 1 TPSCOPE_PYTHON_TORCH_DIR)
      list(GET _py_torch_out 2 TPSCOPE_PYTHON_TORCH_CXX11_ABI)
      if(TPSCOPE_PYTHON_AUTOGRAD AND NOT EXISTS "${TPSCOPE_PYTHON_TORCH_DIR}/include/torch/csrc/autograd/function.h")
        list(APPEND _py_missing libtorch-dev)  # Debian's python3-torch links its include/ to libtorch-dev's headers
      endif()
    endif()
  else()
    list(APPEND _py_missing python3 python3-torch)
  endif()
  if(_py_missing)
    list(JOIN _py_missing " " _py_missing)
    message(FATAL_ERROR "TPSCOPE_WITH_PYTHON=ON but the Python package cannot be built for '${TPSCOPE_PYTHON}' (it needs "
                        "pybind11, the Python headers and PyTorch importable there). Install the Debian packages "
                        "${_py_missing} (./scripts/setup does), or pass -DTPSCOPE_PYTHON=<python with torch>, or build "
                        "without it: -DTPSCOPE_WITH_PYTHON=OFF")
  endif()
  find_package(pybind11 CONFIG REQUIRED)
  set(TPSCOPE_HAVE_PYTHON ON)
  if(TPSCOPE_PYTHON_AUTOGRAD)
    foreach(_lib torch_python torch torch_cpu c10)
      find_library(TPSCOPE_PYTHON_LIB_${_lib} ${_lib} PATHS ${TPSCOPE_PYTHON_TORCH_DIR}/lib NO_DEFAULT_PATH NO_CACHE)
      if(NOT TPSCOPE_PYTHON_LIB_${_lib})
        message(FATAL_ERROR "TPSCOPE_PYTHON_AUTOGRAD=ON but lib${_lib}.so is not in ${TPSCOPE_PYTHON_TORCH_DIR}/lib "
                            "(the PyTorch of ${TPSCOPE_PYTHON}); build without the C++ backward walk: "
                            "-DTPSCOPE_PYTHON_AUTOGRAD=OFF")
      endif()
      list(APPEND TPSCOPE_PYTHON_TORCH_LIBS ${TPSCOPE_PYTHON_LIB_${_lib}})
    endforeach()
    set(TPSCOPE_HAVE_PYTHON_AUTOGRAD ON)
  endif()
endif()

set(TPSCOPE_HAVE_QT OFF)
if(TPSCOPE_BUILD_GUI)
  find_package(Qt6 6.2 QUIET COMPONENTS Core Gui Widgets Charts Test)
  if(Qt6_FOUND)
    set(TPSCOPE_HAVE_QT ON)
  else()
    message(FATAL_ERROR "TPSCOPE_BUILD_GUI=ON but Qt 6 (Core Gui Widgets Charts Test) was not found. Install the "
                        "Debian packages qt6-base-dev qt6-charts-dev libqt6opengl6-dev (./scripts/setup does; Qt6Charts' "
                        "CMake package needs Qt6OpenGL), or build without the viewer: -DTPSCOPE_BUILD_GUI=OFF")
  endif()
endif()

if(TPSCOPE_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()

set(TPSCOPE_HAVE_BENCHMARK OFF)
if(TPSCOPE_BUILD_BENCH)
  find_package(benchmark QUIET)
  if(benchmark_FOUND)
    set(TPSCOPE_HAVE_BENCHMARK ON)
  else()
    message(FATAL_ERROR "TPSCOPE_BUILD_BENCH=ON but Google Benchmark was not found. Install the Debian package "
                        "libbenchmark-dev (./scripts/setup does), or build without the benchmarks: "
                        "-DTPSCOPE_BUILD_BENCH=OFF")
  endif()
endif()

# Warnings for our own targets only (never for LibTorch's headers, which are included as SYSTEM).
add_library(tpscope_warnings INTERFACE)
target_compile_options(tpscope_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
