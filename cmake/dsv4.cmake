# Helpers shared by every folder's CMakeLists.txt.

# Warnings as errors on the project's own code (never on generated protobuf code).
function(dsv4_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-unused-parameter>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall -Werror=all-warnings>)
endfunction()

# dsv4_library(NAME SOURCES ... [CUDA_SOURCES ...] DEPS ...)
function(dsv4_library name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${A_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${A_DEPS})
  dsv4_warnings(${name})
endfunction()

# dsv4_test(NAME SOURCES ... DEPS ... [LABELS ...] [RESOURCE_LOCK lock] [SERIAL]): one GoogleTest binary, each
# test case its own ctest. RESOURCE_LOCK: tests that start several processes and assert how fast something happens
# share a lock, so `ctest -j` on 2 cores never runs two of them at once (their bounds assume the cores are not
# oversubscribed). SERIAL: the cases run with nothing else beside them (RUN_SERIAL), for the longest timing tests.
function(dsv4_test name)
  cmake_parse_arguments(A "SERIAL" "RESOURCE_LOCK" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PRIVATE ${A_DEPS} GTest::gtest GTest::gtest_main GTest::gmock)
  dsv4_warnings(${name})
  set(labels ${A_LABELS})
  if(NOT labels)
    set(labels unit)
  endif()
  # Two single-valued properties: a ';'-joined ENVIRONMENT list would be split by gtest_discover_tests and
  # only its first entry would reach the tests.
  set(extra_props)
  if(A_RESOURCE_LOCK)
    list(APPEND extra_props RESOURCE_LOCK ${A_RESOURCE_LOCK})
  endif()
  if(A_SERIAL)
    list(APPEND extra_props RUN_SERIAL TRUE)
  endif()
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST
    PROPERTIES LABELS "${labels}" ENVIRONMENT "DSV4_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
               ENVIRONMENT_MODIFICATION "DSV4_BINARY_DIR=set:${PROJECT_BINARY_DIR}" ${extra_props})
endfunction()

# Adds every immediate subfolder of the calling folder that has its own CMakeLists.txt.
macro(dsv4_add_subfolders)
  file(GLOB _dsv4_subdirs LIST_DIRECTORIES true ${CMAKE_CURRENT_SOURCE_DIR}/*)
  foreach(_dsv4_d ${_dsv4_subdirs})
    if(IS_DIRECTORY ${_dsv4_d} AND EXISTS ${_dsv4_d}/CMakeLists.txt)
      add_subdirectory(${_dsv4_d})
    endif()
  endforeach()
endmacro()
