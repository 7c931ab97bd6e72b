# The generated bucket kernels: gen/generate.py writes, at build time into ${CMAKE_CURRENT_BINARY_DIR}/gen, one
# source per bucket of UATTN_KERNEL_BUCKETS and ISA of gen/manifest.json that takes its dtype, and the registry
# (the buckets and the ISA ladder). Sets UATTN_GENERATED_SOURCES.
#
# The default bucket list is the manifest's default_buckets (what it covers and why: there). A build may list
# its own (the Makefile's sanitized, ThreadSanitizer and fuzz builds do, on every build); an existing build
# directory keeps a list it was given until it is given another, and follows the manifest's default otherwise.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
set(UATTN_GENERATOR ${CMAKE_CURRENT_SOURCE_DIR}/gen/generate.py)
set(UATTN_MANIFEST ${CMAKE_CURRENT_SOURCE_DIR}/gen/manifest.json)
# the source list depends on both (the ISAs, how sources are named): a change re-runs the configuration
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${UATTN_GENERATOR} ${UATTN_MANIFEST})
execute_process(
  COMMAND ${Python3_EXECUTABLE} ${UATTN_GENERATOR} --default-buckets
  OUTPUT_VARIABLE UATTN_KERNEL_BUCKETS_DEFAULT ERROR_VARIABLE _uattn_gen_error RESULT_VARIABLE _uattn_gen_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _uattn_gen_rc EQUAL 0)
  message(FATAL_ERROR "${_uattn_gen_error}")
endif()
set(_uattn_buckets_doc "Kernel buckets to generate: groups DTYPES:BLOCK_SIZES:HEAD_DIMS:CHUNK_SIZES separated by spaces (see gen/generate.py); default: gen/manifest.json's; empty = generic kernels only")
set(UATTN_KERNEL_BUCKETS "${UATTN_KERNEL_BUCKETS_DEFAULT}" CACHE STRING "${_uattn_buckets_doc}")
# A build directory that took the default follows the manifest when its default changes (a list the user gave
# stays): the default it took is remembered beside the value.
if(DEFINED CACHE{_UATTN_KERNEL_BUCKETS_TAKEN_DEFAULT}
   AND UATTN_KERNEL_BUCKETS STREQUAL _UATTN_KERNEL_BUCKETS_TAKEN_DEFAULT
   AND NOT UATTN_KERNEL_BUCKETS STREQUAL UATTN_KERNEL_BUCKETS_DEFAULT)
  message(STATUS "uattn: gen/manifest.json's default buckets changed; this build takes the new default")
  set(UATTN_KERNEL_BUCKETS "${UATTN_KERNEL_BUCKETS_DEFAULT}" CACHE STRING "${_uattn_buckets_doc}" FORCE)
endif()
set(_UATTN_KERNEL_BUCKETS_TAKEN_DEFAULT "${UATTN_KERNEL_BUCKETS_DEFAULT}" CACHE INTERNAL
  "the manifest's default when this build directory was last configured")

execute_process(
  COMMAND ${Python3_EXECUTABLE} ${UATTN_GENERATOR} --buckets "${UATTN_KERNEL_BUCKETS}" --list
  OUTPUT_VARIABLE _uattn_gen_list ERROR_VARIABLE _uattn_gen_error RESULT_VARIABLE _uattn_gen_rc)
if(NOT _uattn_gen_rc EQUAL 0)
  message(FATAL_ERROR "${_uattn_gen_error}")
endif()
string(STRIP "${_uattn_gen_list}" _uattn_gen_list)
string(REPLACE "\n" ";" _uattn_gen_list "${_uattn_gen_list}")
set(UATTN_GENERATED_SOURCES "")
foreach(f ${_uattn_gen_list})
  list(APPEND UATTN_GENERATED_SOURCES ${CMAKE_CURRENT_BINARY_DIR}/gen/${f})
endforeach()
list(LENGTH UATTN_GENERATED_SOURCES _uattn_gen_count)
math(EXPR _uattn_gen_count "${_uattn_gen_count} - 1")
message(STATUS "uattn: ${_uattn_gen_count} generated kernel buckets (UATTN_KERNEL_BUCKETS)")

add_custom_command(
  OUTPUT ${UATTN_GENERATED_SOURCES}
  COMMAND ${Python3_EXECUTABLE} ${UATTN_GENERATOR} --buckets "${UATTN_KERNEL_BUCKETS}"
          --out ${CMAKE_CURRENT_BINARY_DIR}/gen
  DEPENDS ${UATTN_GENERATOR} ${UATTN_MANIFEST}
  COMMENT "Generating ${_uattn_gen_count} bucket kernels and their registry"
  VERBATIM)
