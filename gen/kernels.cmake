# The generated bucket kernels: gen/generate.py writes one source per bucket of UATTN_KERNEL_BUCKETS and the
# registry, at build time, into ${CMAKE_CURRENT_BINARY_DIR}/gen. Sets UATTN_GENERATED_SOURCES.
#
# The default covers common models at a build cost of about three minutes on 2 cores (the library from clean:
# 182 s, 25 buckets for avx2 and, decode kernel only, avx512; the bf16 ones also for avx512bf16): bf16 caches at every block
# size from 16 to 256 with head dim 128 (Llama, Mistral, Qwen), at block sizes 16 and 128 (vLLM's CPU and
# Gaudi defaults) with head dims 64 (small models), 80 (Phi-2), 96 (Phi-3), 192 (MLA's query-key dim) and
# 256 (Gemma); Gaudi-style chunked shared parts (16 and 64 blocks a chunk) at block size 128; f16 and f32
# caches at block sizes 16 and 128 with head dims 64 and 128. Every other shape runs the generic kernels.
set(UATTN_KERNEL_BUCKETS_DEFAULT
  "bf16:16,32,64,128,256:128:0 bf16:16,128:64,80,96,192,256:0 bf16:128:128:16,64 f16,f32:16,128:64,128:0")
set(UATTN_KERNEL_BUCKETS "${UATTN_KERNEL_BUCKETS_DEFAULT}" CACHE STRING
  "Kernel buckets to generate: groups DTYPES:BLOCK_SIZES:HEAD_DIMS:CHUNK_SIZES separated by spaces (see gen/generate.py); empty = generic kernels only")

find_package(Python3 REQUIRED COMPONENTS Interpreter)
set(UATTN_GENERATOR ${CMAKE_CURRENT_SOURCE_DIR}/gen/generate.py)
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
  DEPENDS ${UATTN_GENERATOR}
  COMMENT "Generating ${_uattn_gen_count} bucket kernels and their registry"
  VERBATIM)
