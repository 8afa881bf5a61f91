# Helpers shared by every folder's CMakeLists.txt.

# Warnings as errors and the optional sanitizers, for code of this project only.
function(dtrain_target_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror -Wno-error=deprecated-declarations>
    # errno from math functions is never read; without this GCC cannot vectorise sqrt.
    $<$<COMPILE_LANGUAGE:CXX>:-fno-math-errno>
    # Floating-point exception flags are never read either. Without this, on a
    # CPU without AVX-512's masks (AVX2 only), GCC keeps every select with a
    # float operation on one side (fast_exp's underflow to 0, dropout's keep)
    # as a branch, and the loops around them scalar: GELU's forward with its
    # derivative, softmax, cross-entropy, dropout. Values are unchanged.
    $<$<COMPILE_LANGUAGE:CXX>:-fno-trapping-math>)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-march=${DTRAIN_CPU_MARCH}>)
  if(DTRAIN_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
endfunction()

# dtrain_add_library(name [PLUGIN] SOURCES... DEPS...): one library per folder,
# named dtrain_<folder>. PLUGIN: a folder's part of the CUDA plugin (core/cuda,
# nn/cuda, comm/nccl) instead: object files, so the plugin holds them itself
# and exports their DTRAIN_PLUGIN_EXPORT entry points (static archives go in
# with --exclude-libs and export nothing; the CUDA kernel test links the
# objects too), compiled with hidden visibility and CUDA warnings as errors.
function(dtrain_add_library name)
  cmake_parse_arguments(ARG "PLUGIN" "" "SOURCES;DEPS" ${ARGN})
  if(ARG_PLUGIN)
    add_library(${name} OBJECT ${ARG_SOURCES})
    target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings -Xcompiler=-Wall,-Wextra>)
    set_target_properties(${name} PROPERTIES CXX_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden
                                             VISIBILITY_INLINES_HIDDEN ON)
  else()
    add_library(${name} STATIC ${ARG_SOURCES})
  endif()
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR}/generated)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  dtrain_target_defaults(${name})
endfunction()

# dtrain_add_executable(name SOURCES... DEPS...): a binary in build/bin.
function(dtrain_add_executable name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  dtrain_target_defaults(${name})
endfunction()

# dtrain_add_test(file.cpp DEPS... LABELS...): one GoogleTest binary per test file.
function(dtrain_add_test file)
  cmake_parse_arguments(ARG "" "" "DEPS;LABELS" ${ARGN})
  get_filename_component(stem ${file} NAME_WE)
  set(target ${stem})
  add_executable(${target} ${file})
  target_link_libraries(${target} PRIVATE ${ARG_DEPS} GTest::gtest_main GTest::gmock)
  dtrain_target_defaults(${target})
  set_target_properties(${target} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  target_compile_definitions(${target} PRIVATE
    DTRAIN_TEST_BIN_DIR="${CMAKE_BINARY_DIR}/bin" DTRAIN_TEST_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    DTRAIN_TEST_PROGRAM_DIR="${CMAKE_BINARY_DIR}/tests")
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  gtest_discover_tests(${target}
    PROPERTIES ENVIRONMENT OMP_NUM_THREADS=1
    DISCOVERY_TIMEOUT 60)
  # The labels go on once ctest has read the discovered tests (their names
  # in ${target}_TESTS): gtest_discover_tests would pass one label, not a list.
  set(label_file ${CMAKE_CURRENT_BINARY_DIR}/${target}_labels.cmake)
  file(WRITE ${label_file}
       "if(${target}_TESTS)\n  set_tests_properties(\${${target}_TESTS} PROPERTIES LABELS \"${ARG_LABELS}\")\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${label_file})
endfunction()

# DTRAIN_WITH_CUDA: AUTO enables CUDA when nvcc is found (CMAKE_CUDA_COMPILER,
# then PATH, then the toolkit's usual /usr/local/cuda/bin). Defines
# DTRAIN_HAVE_CUDA and, when it is 1, the imported target dtrain_nccl.
macro(dtrain_configure_cuda)
  set(DTRAIN_HAVE_CUDA 0)
  set(_nvcc "${CMAKE_CUDA_COMPILER}")
  if(NOT _nvcc)
    find_program(DTRAIN_NVCC nvcc PATHS /usr/local/cuda/bin)
    set(_nvcc "${DTRAIN_NVCC}")
  endif()
  if(DTRAIN_WITH_CUDA STREQUAL "ON" OR (DTRAIN_WITH_CUDA STREQUAL "AUTO" AND _nvcc))
    if(NOT _nvcc)
      message(FATAL_ERROR "DTRAIN_WITH_CUDA=ON but nvcc was found neither on PATH nor in /usr/local/cuda/bin; "
                          "set CMAKE_CUDA_COMPILER")
    endif()
    set(CMAKE_CUDA_COMPILER "${_nvcc}")
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "90;100")
    endif()
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    # CMake 3.25 predates nvcc's C++20 flag.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    # NCCL has no CMake config: found beside the toolkit, or where the system keeps it.
    find_path(DTRAIN_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} REQUIRED)
    find_library(DTRAIN_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} REQUIRED)
    add_library(dtrain_nccl UNKNOWN IMPORTED)
    set_target_properties(dtrain_nccl PROPERTIES IMPORTED_LOCATION ${DTRAIN_NCCL_LIBRARY}
                                                 INTERFACE_INCLUDE_DIRECTORIES ${DTRAIN_NCCL_INCLUDE_DIR})
    set(DTRAIN_HAVE_CUDA 1)
    message(STATUS "dtrain: CUDA enabled (${CMAKE_CUDA_COMPILER}, sm ${CMAKE_CUDA_ARCHITECTURES})")
  else()
    message(STATUS "dtrain: CUDA disabled")
  endif()
endmacro()
