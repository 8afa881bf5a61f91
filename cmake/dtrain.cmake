# Helpers shared by every folder's CMakeLists.txt.

# Warnings as errors and the optional sanitizers, for code of this project only.
function(dtrain_target_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror -Wno-error=deprecated-declarations>
    # errno from math functions is never read; without this GCC cannot vectorise sqrt.
    $<$<COMPILE_LANGUAGE:CXX>:-fno-math-errno>)
  if(DTRAIN_NATIVE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
  endif()
  if(DTRAIN_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
endfunction()

# dtrain_add_library(name SOURCES... DEPS...): one library per folder, named dtrain_<folder>.
function(dtrain_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
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
    PROPERTIES LABELS "${ARG_LABELS}" ENVIRONMENT OMP_NUM_THREADS=1
    DISCOVERY_TIMEOUT 60)
endfunction()

# DTRAIN_WITH_CUDA: AUTO enables CUDA when the toolkit's nvcc exists.
macro(dtrain_configure_cuda)
  set(DTRAIN_HAVE_CUDA 0)
  set(_nvcc /usr/local/cuda/bin/nvcc)
  if(DTRAIN_WITH_CUDA STREQUAL "ON" OR (DTRAIN_WITH_CUDA STREQUAL "AUTO" AND EXISTS ${_nvcc}))
    if(NOT CMAKE_CUDA_COMPILER AND EXISTS ${_nvcc})
      set(CMAKE_CUDA_COMPILER ${_nvcc})
    endif()
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "90;100")
    endif()
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    # CMake 3.25 predates nvcc's C++20 flag; CUDA targets inherit CXX_STANDARD 20.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(DTRAIN_HAVE_CUDA 1)
    message(STATUS "dtrain: CUDA enabled (${CMAKE_CUDA_COMPILER}, sm ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(DTRAIN_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DTRAIN_WITH_CUDA=ON but nvcc was not found at ${_nvcc}")
  else()
    message(STATUS "dtrain: CUDA disabled")
  endif()
endmacro()
