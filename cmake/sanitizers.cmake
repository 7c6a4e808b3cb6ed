# Sanitizer and fuzzing builds (docs/security.md "Fuzzing and sanitizers"). Both are off in the normal build.
#
#   DSV4_SANITIZE=address,undefined   AddressSanitizer + UndefinedBehaviorSanitizer on every target
#   DSV4_SANITIZE=thread              ThreadSanitizer on every target
#   DSV4_FUZZ=ON                      coverage instrumentation for libFuzzer on every target and the fuzz/ targets;
#                                     needs clang (CMAKE_CXX_COMPILER=clang++) and is meant with address,undefined
#
# scripts/sanitize.sh configures these folders (build-asan, build-tsan) and runs what CI runs in them.
# The flags are added to every target so that the libraries a test links are instrumented like the test itself;
# the Debian libraries (gRPC, protobuf, abseil, Gloo) are not instrumented: see docs/security.md for what that
# means for ThreadSanitizer.

set(DSV4_SANITIZE "" CACHE STRING "Sanitizers for every target: '', 'address,undefined' or 'thread'")
option(DSV4_FUZZ "Build the libFuzzer targets in fuzz/ (clang only)" OFF)

if(DSV4_SANITIZE)
  if(NOT DSV4_SANITIZE MATCHES "^(address,undefined|undefined,address|address|undefined|thread)$")
    message(FATAL_ERROR "DSV4_SANITIZE=${DSV4_SANITIZE}: expected address,undefined or thread")
  endif()
  if(DSV4_HAVE_CUDA)
    message(FATAL_ERROR "DSV4_SANITIZE needs -DDSV4_ENABLE_CUDA=OFF (host sanitizers do not cover device code)")
  endif()
  # -fno-sanitize-recover: a UBSan finding aborts the process, so the test that hit it fails.
  # Frame pointers keep sanitizer stack traces readable at -O1.
  set(_dsv4_san -fsanitize=${DSV4_SANITIZE} -fno-omit-frame-pointer)
  if(DSV4_SANITIZE MATCHES "undefined")
    list(APPEND _dsv4_san -fno-sanitize-recover=all)
  endif()
  add_compile_options(${_dsv4_san})
  add_link_options(-fsanitize=${DSV4_SANITIZE})
  message(STATUS "dsv4: sanitizers ${DSV4_SANITIZE} on every target")
endif()

if(DSV4_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "DSV4_FUZZ needs clang (-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang)")
  endif()
  # Coverage feedback for every library; only the fuzz targets link libFuzzer's main (-fsanitize=fuzzer).
  add_compile_options(-fsanitize=fuzzer-no-link)
  message(STATUS "dsv4: libFuzzer targets in fuzz/")
endif()

# The CPU model's compute libraries run every forward of the integration tests (real dsv4-worker processes on the
# tiny checkpoint); at -O1 with sanitizers those tests take minutes. They stay instrumented but are optimised like
# a release build. Applied once every folder has defined its targets.
# No fuzzing coverage there either: no fuzz target reaches the model, and the counters keep its loops scalar.
set(_dsv4_hot_flags "")
if(DSV4_FUZZ)
  set(_dsv4_hot_flags -fno-sanitize=fuzzer-no-link -fno-sanitize=pointer-overflow)
endif()
function(_dsv4_sanitizer_optimize_hot_libraries)
  foreach(t dsv4_kernels_cpu dsv4_model dsv4_sparse_mla)
    if(TARGET ${t})
      target_compile_options(${t} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O2 ${_dsv4_hot_flags}>)
    endif()
  endforeach()
endfunction()
if(DSV4_SANITIZE)
  cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL _dsv4_sanitizer_optimize_hot_libraries)
endif()
