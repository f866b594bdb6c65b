# Finds kdflow's dependencies: Debian packages through the usual config/pkg-config files, and the
# PyPI wheels (LibTorch, oneDNN with the TBB runtime, oneTBB) in the virtual environment that
# scripts/setup.sh created. The venv is found without flags: -DKD_VENV, $KDFLOW_DEPS/venv, the path
# setup.sh recorded in .kdflow-venv, or ~/.cache/kdflow/venv.

set(KD_VENV "" CACHE PATH "Python venv holding torch, onednn-devel-cpu-tbb and tbb-devel")
if(NOT KD_VENV)
  if(DEFINED ENV{KDFLOW_DEPS} AND EXISTS "$ENV{KDFLOW_DEPS}/venv")
    set(KD_VENV "$ENV{KDFLOW_DEPS}/venv")
  elseif(EXISTS "${CMAKE_SOURCE_DIR}/.kdflow-venv")
    file(STRINGS "${CMAKE_SOURCE_DIR}/.kdflow-venv" KD_VENV LIMIT_COUNT 1)
  elseif(EXISTS "$ENV{HOME}/.cache/kdflow/venv")
    set(KD_VENV "$ENV{HOME}/.cache/kdflow/venv")
  endif()
  set(KD_VENV "${KD_VENV}" CACHE PATH "" FORCE)
endif()
if(NOT KD_VENV OR NOT EXISTS "${KD_VENV}")
  message(FATAL_ERROR "kdflow: no dependency venv found; run scripts/setup.sh first (or pass -DKD_VENV=...)")
endif()
file(GLOB KD_SITE_PACKAGES LIST_DIRECTORIES true "${KD_VENV}/lib/python3*/site-packages")
list(GET KD_SITE_PACKAGES 0 KD_SITE_PACKAGES)
list(PREPEND CMAKE_PREFIX_PATH "${KD_VENV}" "${KD_SITE_PACKAGES}/torch/share/cmake")
message(STATUS "kdflow: dependency venv ${KD_VENV}")

find_package(Threads REQUIRED)
# Under TSan, oneTBB itself must be instrumented, or its tasks' hand-offs read as races: the tsan
# preset builds and runs on the one scripts/tbb_tsan.sh makes (its headers first, its libtbb first
# in the RPATH, so the uninstrumented oneDNN loads it too).
set(KD_TBB_TSAN "" CACHE PATH "oneTBB built with -fsanitize=thread (scripts/tbb_tsan.sh)")
if(KD_SANITIZE MATCHES "thread")
  if(NOT KD_TBB_TSAN)
    if(DEFINED ENV{KDFLOW_DEPS})
      set(KD_TBB_TSAN "$ENV{KDFLOW_DEPS}/tbb-tsan")
    else()
      set(KD_TBB_TSAN "$ENV{HOME}/.cache/kdflow/tbb-tsan")
    endif()
    set(KD_TBB_TSAN "${KD_TBB_TSAN}" CACHE PATH "" FORCE)
  endif()
  if(NOT EXISTS "${KD_TBB_TSAN}/lib/cmake/TBB")
    message(FATAL_ERROR "kdflow: no TSan-built oneTBB in ${KD_TBB_TSAN}; run bash scripts/tbb_tsan.sh")
  endif()
  set(TBB_DIR "${KD_TBB_TSAN}/lib/cmake/TBB" CACHE PATH "" FORCE)
  include_directories(BEFORE SYSTEM "${KD_TBB_TSAN}/include")
  message(STATUS "kdflow: TSan-built oneTBB from ${KD_TBB_TSAN}")
endif()
find_package(TBB 2021 REQUIRED CONFIG)
find_package(dnnl 3 REQUIRED CONFIG)
find_package(PkgConfig REQUIRED)
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc>=2)
find_package(CLI11 REQUIRED CONFIG)
find_package(fmt REQUIRED CONFIG)
find_package(spdlog REQUIRED CONFIG)
find_package(nlohmann_json 3 REQUIRED CONFIG)
pkg_check_modules(TOMLPP REQUIRED IMPORTED_TARGET tomlplusplus>=3)
# Image folders: libjpeg-turbo's libjpeg API (DCT-scaled decoding of the crop's region:
# jpeg_crop_scanline, jpeg_skip_scanlines), its TurboJPEG API (the tests' JPEG writer) and libpng
# 1.6's simplified API.
pkg_check_modules(LIBJPEG REQUIRED IMPORTED_TARGET libjpeg>=2.0)
pkg_check_modules(TURBOJPEG REQUIRED IMPORTED_TARGET libturbojpeg>=2)
pkg_check_modules(LIBPNG REQUIRED IMPORTED_TARGET libpng16)
# Imported targets are directory-scoped: found here so every directory links them alike.
find_package(Protobuf REQUIRED)
find_package(ZLIB REQUIRED)
# ONNX's message definitions come from the venv's onnx wheel (cpu_teacher/CMakeLists.txt compiles
# its onnx.proto): Debian's libonnx 1.12 stops at IR 8 / opset 17, older than today's exporters.
set(KD_ONNX_PROTO "${KD_SITE_PACKAGES}/onnx/onnx.proto")
if(NOT EXISTS "${KD_ONNX_PROTO}")
  message(FATAL_ERROR "kdflow: ${KD_ONNX_PROTO} not found; run scripts/setup.sh (the venv needs onnx)")
endif()
if(KD_BUILD_TESTS)
  find_package(GTest REQUIRED CONFIG)
endif()
if(KD_BUILD_BENCH)
  find_package(benchmark REQUIRED CONFIG)
endif()

# The wheels' shared libraries live in the venv: give every binary an RPATH to them so that
# `kdflow` runs without LD_LIBRARY_PATH. Old-style RPATH (not RUNPATH) because libdnnl carries no
# RUNPATH of its own and finds libtbb, libimf and libintlc only through the executable's RPATH.
add_link_options(-Wl,--disable-new-dtags)
set(KD_VENV_LIBDIR "${KD_VENV}/lib")
set(CMAKE_BUILD_RPATH "${KD_VENV_LIBDIR}")
set(CMAKE_INSTALL_RPATH "${KD_VENV_LIBDIR}")
if(KD_SANITIZE MATCHES "thread")
  list(PREPEND CMAKE_BUILD_RPATH "${KD_TBB_TSAN}/lib")
  list(PREPEND CMAKE_INSTALL_RPATH "${KD_TBB_TSAN}/lib")
endif()

if(KD_WITH_TORCH)
  # A CUDA LibTorch wants the CUDA toolkit at configure time; /usr/local/cuda is the usual place.
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    list(APPEND CMAKE_PREFIX_PATH /usr/local/cuda)
  endif()
  # Without this, Torch's CUDA config tries to run a program on a GPU to find its architecture.
  if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT TORCH_CUDA_ARCH_LIST)
    set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
  endif()
  # TorchConfig finds its libraries with find_library(... PATHS <torch>/lib), which searches the
  # system's folders first: with Debian's python3-torch installed it would link /usr/lib's libc10
  # (1.13) into a 2.11 build. Each library it looks for is named here from the venv's torch, so
  # no other copy on the machine can be picked (kdflow_linked_libraries checks the binaries).
  set(KD_TORCH_LIBDIR "${KD_SITE_PACKAGES}/torch/lib")
  foreach(_kd_pair c10_LIBRARY:c10 TORCH_LIBRARY:torch C10_CUDA_LIBRARY:c10_cuda
                   CAFFE2_NVRTC_LIBRARY:caffe2_nvrtc kineto_LIBRARY:kineto)
    string(REPLACE ":" ";" _kd_pair "${_kd_pair}")
    list(GET _kd_pair 0 _kd_var)
    list(GET _kd_pair 1 _kd_name)
    if(EXISTS "${KD_TORCH_LIBDIR}/lib${_kd_name}.so")
      set(${_kd_var} "${KD_TORCH_LIBDIR}/lib${_kd_name}.so" CACHE FILEPATH "" FORCE)
    else()
      set(${_kd_var} "${_kd_var}-NOTFOUND" CACHE FILEPATH "" FORCE) # never a system copy
    endif()
  endforeach()
  find_package(Torch REQUIRED CONFIG)
  list(APPEND CMAKE_BUILD_RPATH "${KD_TORCH_LIBDIR}")
  list(APPEND CMAKE_INSTALL_RPATH "${KD_TORCH_LIBDIR}")
  if(TARGET CUDA::cudart)
    set(KD_HAVE_CUDA ON)
  else()
    find_package(CUDAToolkit QUIET)
    set(KD_HAVE_CUDA ${CUDAToolkit_FOUND})
  endif()
  message(STATUS "kdflow: LibTorch ${Torch_VERSION}, CUDA paths ${KD_HAVE_CUDA}")
endif()
