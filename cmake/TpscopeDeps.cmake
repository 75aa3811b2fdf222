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

# One interpreter, one PyTorch: the engine (core/) builds against the LibTorch inside that interpreter's PyTorch 2.x
# (the wheel ships LibTorch's CMake package, headers and libraries), and the Python package is built for the same
# interpreter and PyTorch. The interpreter: -DTPSCOPE_PYTHON=..., else $TPSCOPE_PYTHON, else the virtual environment
# ./scripts/setup made (.venv), else python3 on PATH.
if(NOT TPSCOPE_PYTHON)
  if(DEFINED ENV{TPSCOPE_PYTHON} AND NOT "$ENV{TPSCOPE_PYTHON}" STREQUAL "")
    set(TPSCOPE_PYTHON "$ENV{TPSCOPE_PYTHON}")
  elseif(EXISTS ${CMAKE_SOURCE_DIR}/.venv/bin/python3)
    set(TPSCOPE_PYTHON ${CMAKE_SOURCE_DIR}/.venv/bin/python3)
  else()
    find_program(TPSCOPE_PYTHON_ON_PATH python3 NO_CACHE)
    set(TPSCOPE_PYTHON "${TPSCOPE_PYTHON_ON_PATH}")
  endif()
endif()
set(TPSCOPE_PYTHON "${TPSCOPE_PYTHON}" CACHE FILEPATH "Python interpreter whose PyTorch (>= 2.4) tpscope builds against")
set(TPSCOPE_TORCH_MIN_VERSION 2.4)

# That PyTorch's version, folder, C++ ABI, CMake folder and whether it is a CUDA build.
set(TPSCOPE_PYTHON_TORCH_VERSION "")
if(TPSCOPE_PYTHON AND (TPSCOPE_WITH_TORCH OR TPSCOPE_WITH_PYTHON))
  execute_process(COMMAND ${TPSCOPE_PYTHON} -c "import os, torch, torch.distributed; print(torch.__version__); \
print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.utils.cmake_prefix_path)"
                  OUTPUT_VARIABLE _py_torch_out OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE _py_torch ERROR_VARIABLE _py_torch_err)
  if(_py_torch EQUAL 0)
    string(REPLACE "\n" ";" _py_torch_out "${_py_torch_out}")
    list(GET _py_torch_out 0 TPSCOPE_PYTHON_TORCH_VERSION)
    list(GET _py_torch_out 1 TPSCOPE_PYTHON_TORCH_DIR)
    list(GET _py_torch_out 2 TPSCOPE_PYTHON_TORCH_CXX11_ABI)
    list(GET _py_torch_out 3 TPSCOPE_PYTHON_TORCH_CMAKE)
    string(REGEX MATCH "^[0-9]+\\.[0-9]+(\\.[0-9]+)?" _py_torch_numeric "${TPSCOPE_PYTHON_TORCH_VERSION}")
    if(_py_torch_numeric VERSION_LESS TPSCOPE_TORCH_MIN_VERSION)
      message(FATAL_ERROR "${TPSCOPE_PYTHON} has PyTorch ${TPSCOPE_PYTHON_TORCH_VERSION}; tpscope needs PyTorch >= "
                          "${TPSCOPE_TORCH_MIN_VERSION}. Run ./scripts/setup (it makes .venv with a current PyTorch), "
                          "or pass -DTPSCOPE_PYTHON=<python with PyTorch >= ${TPSCOPE_TORCH_MIN_VERSION}>")
    endif()
  endif()
endif()
set(_no_torch_hint "Run ./scripts/setup (it makes .venv with PyTorch 2.x from PyPI), or pass -DTPSCOPE_PYTHON=<python \
with PyTorch >= ${TPSCOPE_TORCH_MIN_VERSION}>")

set(TPSCOPE_HAVE_TORCH OFF)
set(TPSCOPE_HAVE_NCCL OFF)
if(TPSCOPE_WITH_TORCH)
  if(NOT TPSCOPE_PYTHON_TORCH_VERSION)
    message(FATAL_ERROR "TPSCOPE_WITH_TORCH=ON but '${TPSCOPE_PYTHON}' cannot import torch. ${_no_torch_hint}, or "
                        "build without the engine: -DTPSCOPE_WITH_TORCH=OFF")
  endif()
  list(APPEND CMAKE_PREFIX_PATH ${TPSCOPE_PYTHON_TORCH_CMAKE})
  # A CUDA wheel's CMake package looks for the CUDA toolkit; it is installed off PATH in its standard place.
  if(NOT CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CUDAToolkit_ROOT /usr/local/cuda)
    set(CUDA_TOOLKIT_ROOT_DIR /usr/local/cuda CACHE PATH "")
  endif()
  # tpscope compiles no CUDA kernels; naming the architectures keeps the package from probing for a GPU at configure
  # time (a try_run that fails on a machine without one).
  if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT TORCH_CUDA_ARCH_LIST)
    set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
  endif()
  find_package(Torch REQUIRED)
  set(TPSCOPE_HAVE_TORCH ON)
  # Gloo's headers: the wheel has none (its Gloo is inside libtorch_cpu); Debian's libgloo-dev headers declare the
  # same types. Only the headers are used: nothing links Debian's libgloo.
  find_path(TPSCOPE_GLOO_INCLUDE gloo/algorithm.h)
  if(NOT TPSCOPE_GLOO_INCLUDE)
    message(FATAL_ERROR "TPSCOPE_WITH_TORCH=ON but Gloo's headers were not found (PyTorch's wheel ships none). Install "
                        "the Debian package libgloo-dev (./scripts/setup does)")
  endif()
  # A CUDA build of PyTorch (the PyPI wheel for Linux): the engine's CUDA device path and NCCL process groups.
  if(TARGET torch_cuda)
    set(TPSCOPE_TORCH_CUDA_VERSION "${CUDAToolkit_VERSION}")
    execute_process(COMMAND ${TPSCOPE_PYTHON} -c "import torch; print(torch.version.cuda or ''); \
v = torch.cuda.nccl.version(); print('.'.join(map(str, v)) if isinstance(v, tuple) else v)"
                    OUTPUT_VARIABLE _torch_cuda_out OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    string(REPLACE "\n" ";" _torch_cuda_out "${_torch_cuda_out}")
    list(LENGTH _torch_cuda_out _n)
    if(_n EQUAL 2)
      list(GET _torch_cuda_out 0 TPSCOPE_TORCH_CUDA_VERSION)
      list(GET _torch_cuda_out 1 TPSCOPE_NCCL_VERSION)
    endif()
    # nccl.h: the NCCL PyTorch was built with (the nvidia-nccl wheel beside it), else the toolkit's.
    get_filename_component(_site "${TPSCOPE_PYTHON_TORCH_DIR}" DIRECTORY)
    find_path(TPSCOPE_NCCL_INCLUDE nccl.h HINTS ${_site}/nvidia/nccl/include ${CUDAToolkit_INCLUDE_DIRS}
              NO_CACHE)
    find_library(TPSCOPE_NCCL_LIB NAMES libnccl.so.2 nccl NAMES_PER_DIR
                 HINTS ${_site}/nvidia/nccl/lib ${CUDAToolkit_LIBRARY_DIR} NO_CACHE)
    if(TPSCOPE_NCCL_INCLUDE AND TPSCOPE_NCCL_LIB)
      set(TPSCOPE_HAVE_NCCL ON)
      add_library(tpscope_nccl INTERFACE)
      target_include_directories(tpscope_nccl SYSTEM INTERFACE ${TPSCOPE_NCCL_INCLUDE})
      target_link_libraries(tpscope_nccl INTERFACE ${TPSCOPE_NCCL_LIB})
      # libtorch_cuda needs the NCCL it was built with; named on every link line that has torch, the linker takes it
      # rather than the toolkit's older libnccl it would otherwise find through the toolkit's rpath.
      set_property(TARGET torch APPEND PROPERTY INTERFACE_LINK_LIBRARIES ${TPSCOPE_NCCL_LIB})
      # PyTorch's own CUDA libraries (its wheels) before the toolkit's: one libcudart per process, the one it was built with.
      file(GLOB TPSCOPE_TORCH_CUDA_RPATH LIST_DIRECTORIES true ${_site}/nvidia/*/lib ${_site}/nvidia/cu*/lib)
    else()
      message(FATAL_ERROR "PyTorch ${TPSCOPE_PYTHON_TORCH_VERSION} is a CUDA build, but nccl.h / libnccl were not "
                          "found (looked in ${_site}/nvidia/nccl and the CUDA toolkit): reinstall the nvidia-nccl wheel "
                          "PyTorch depends on, or build without the engine: -DTPSCOPE_WITH_TORCH=OFF")
    endif()
  endif()
endif()

set(TPSCOPE_HAVE_CUDA OFF)
if(TPSCOPE_WITH_CUDA)  # AUTO and ON
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND TARGET CUDA::cupti)
    set(TPSCOPE_HAVE_CUDA ON)
    find_file(_cupti_version_h cupti_version.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_ROOT}/extras/CUPTI/include
              NO_CACHE)
    if(_cupti_version_h)
      file(STRINGS "${_cupti_version_h}" _cupti_line REGEX "#define CUPTI_API_VERSION [0-9]+")
      string(REGEX MATCH "[0-9]+" TPSCOPE_CUPTI_API_VERSION "${_cupti_line}")
    endif()
  elseif(TPSCOPE_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TPSCOPE_WITH_CUDA=ON but the CUDA toolkit with CUPTI was not found "
                        "(use -DTPSCOPE_WITH_CUDA=AUTO to build NVTX/CUPTI only where it is)")
  endif()
endif()

# The Python package is built for TPSCOPE_PYTHON (above), the interpreter whose PyTorch it instruments — not
# whatever python3 comes first on PATH.
set(TPSCOPE_HAVE_PYTHON OFF)
set(TPSCOPE_HAVE_PYTHON_AUTOGRAD OFF)
if(TPSCOPE_WITH_PYTHON)
  set(_py_missing "")
  if(TPSCOPE_PYTHON)
    set(Python3_EXECUTABLE "${TPSCOPE_PYTHON}")
    find_package(Python3 QUIET COMPONENTS Interpreter Development.Module)
  endif()
  if(NOT Python3_Development.Module_FOUND)
    list(APPEND _py_missing "the Python headers (python3-dev)")
  endif()
  # pybind11's CMake package: the interpreter's own (pip's pybind11), else Debian's. Looked for only once that
  # interpreter is found: without it, pybind11 goes looking for a Python of its own.
  if(Python3_Interpreter_FOUND)
    execute_process(COMMAND ${Python3_EXECUTABLE} -c "import pybind11; print(pybind11.get_cmake_dir())"
                    OUTPUT_VARIABLE _py_pybind11_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_py_pybind11_dir)
      list(APPEND CMAKE_PREFIX_PATH ${_py_pybind11_dir})
    endif()
  endif()
  find_package(pybind11 CONFIG QUIET)
  if(NOT pybind11_FOUND)
    list(APPEND _py_missing "pybind11 (pip install pybind11, or Debian's pybind11-dev)")
  endif()
  if(NOT TPSCOPE_PYTHON_TORCH_VERSION)
    list(APPEND _py_missing "PyTorch >= ${TPSCOPE_TORCH_MIN_VERSION}")
  elseif(TPSCOPE_PYTHON_AUTOGRAD AND NOT EXISTS "${TPSCOPE_PYTHON_TORCH_DIR}/include/torch/csrc/autograd/function.h")
    list(APPEND _py_missing "PyTorch's C++ headers (a wheel that ships include/)")
  endif()
  if(_py_missing)
    list(JOIN _py_missing ", " _py_missing)
    message(FATAL_ERROR "TPSCOPE_WITH_PYTHON=ON but the Python package cannot be built for '${TPSCOPE_PYTHON}': it "
                        "needs ${_py_missing}. ${_no_torch_hint}, or build without it: -DTPSCOPE_WITH_PYTHON=OFF")
  endif()
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
