# Build options and the per-target compile settings every offsim target links.

set(OFFSIM_WITH_CUDA "AUTO" CACHE STRING "Build the CUDA backend and calibration (AUTO|ON|OFF)")
set(OFFSIM_WITH_NCCL "AUTO" CACHE STRING "Build NCCL collectives into the CUDA backend (AUTO|ON|OFF)")
set(OFFSIM_WITH_QT "AUTO" CACHE STRING "Build the Qt6 Charts GUI (AUTO|ON|OFF)")
set(OFFSIM_WITH_MPI "AUTO" CACHE STRING "Build MPI sharding of sweeps (AUTO|ON|OFF)")
set(OFFSIM_WITH_PYTHON "AUTO" CACHE STRING "Build the `offsim` Python module with pybind11 (AUTO|ON|OFF)")
foreach(opt OFFSIM_WITH_CUDA OFFSIM_WITH_NCCL OFFSIM_WITH_QT OFFSIM_WITH_MPI OFFSIM_WITH_PYTHON)
  set_property(CACHE ${opt} PROPERTY STRINGS AUTO ON OFF)
  string(TOUPPER "${${opt}}" _value)
  if(NOT _value MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${opt} is '${${opt}}'; expected AUTO, ON or OFF")
  endif()
  set(${opt} "${_value}" CACHE STRING "" FORCE)
endforeach()

option(OFFSIM_BUILD_TESTS "Build tests" ON)
option(OFFSIM_BUILD_BENCHMARKS "Build Google Benchmark benches" ON)
option(OFFSIM_BUILD_FUZZERS "Build libFuzzer targets (clang only)" OFF)
option(OFFSIM_WARNINGS_AS_ERRORS "Treat warnings as errors" OFF)
set(OFFSIM_SANITIZE "" CACHE STRING "Sanitizers for host code, e.g. 'address,undefined' or 'thread'")

# Every offsim target links this interface library instead of touching global flags.
add_library(offsim_build_options INTERFACE)
target_compile_options(offsim_build_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-missing-field-initializers>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${OFFSIM_WARNINGS_AS_ERRORS}>>:-Werror>)
# GCC 12 reports -Wrestrict on std::string concatenation inlined at -O2/-O3 (GCC bug 105329, a
# false positive inside libstdc++'s char_traits); keep the warning for other compilers.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  target_compile_options(offsim_build_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
endif()
if(OFFSIM_SANITIZE)
  target_compile_options(offsim_build_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${OFFSIM_SANITIZE} -fno-omit-frame-pointer
    -fno-sanitize-recover=all>)
  target_link_options(offsim_build_options INTERFACE -fsanitize=${OFFSIM_SANITIZE})
  # Lets a test run a lighter case list under the sanitizers (replay_examples_test).
  target_compile_definitions(offsim_build_options INTERFACE OFFSIM_SANITIZED=1)
endif()
if(OFFSIM_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "OFFSIM_BUILD_FUZZERS needs clang (libFuzzer); use the 'asan' preset")
  endif()
  # Coverage instrumentation everywhere, so the fuzzers see inside the parsers' libraries.
  target_compile_options(offsim_build_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
endif()
target_include_directories(offsim_build_options INTERFACE ${PROJECT_SOURCE_DIR})
target_compile_definitions(offsim_build_options INTERFACE
  OFFSIM_VERSION="${PROJECT_VERSION}" OFFSIM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

set(OFFSIM_FEATURES "")
macro(offsim_add_feature name state detail)
  string(REPLACE ";" "," _offsim_detail "${detail}")
  list(APPEND OFFSIM_FEATURES "${name}|${state}|${_offsim_detail}")
endmacro()

function(offsim_feature_summary)
  message(STATUS "")
  message(STATUS "offsim ${PROJECT_VERSION} features:")
  foreach(f ${OFFSIM_FEATURES})
    string(REPLACE "|" ";" parts "${f}")
    list(GET parts 0 name)
    list(GET parts 1 state)
    list(GET parts 2 detail)
    string(LENGTH "${name}" len)
    math(EXPR pad "10 - ${len}")
    string(REPEAT " " ${pad} spaces)
    message(STATUS "  ${name}${spaces}${state}  ${detail}")
  endforeach()
  message(STATUS "  sanitize  ${OFFSIM_SANITIZE}")
  message(STATUS "")
endfunction()

find_program(OFFSIM_CCACHE ccache)
if(OFFSIM_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${OFFSIM_CCACHE})
endif()
