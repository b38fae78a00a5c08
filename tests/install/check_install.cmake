# Installs a build tree into a fresh prefix, checks what lands in bin/ (the
# tools, no example), builds tests/install/consumer against it with
# find_package(zero) (README, Install) and runs the result alone and under the
# installed zero-run: a reduce-scatter, and a training program that resumes
# at another world size and stage with the losses of an uninterrupted run.
# Variables: BUILD_DIR, SOURCE_DIR, WORK_DIR, and CXX_FLAGS: the flags the
# library was built with, which the consumer needs when they name a
# sanitizer (its runtime must come first in the program).
# LIBRARY_ONLY=ON (install.library_only): first configure a new tree,
# BUILD_DIR-library-only, with BUILD_DIR's compiler, flags and LibTorch and
# with tests, examples and benchmarks off, check that its install refuses to
# run before the build (naming zero-install-set), build zero-install-set
# alone, check that it is the whole default target, and install that tree
# instead. The tree sits beside BUILD_DIR, not in it: ccache's CCACHE_BASEDIR
# makes source paths relative to the build folder, so only a folder as deep
# as BUILD_DIR finds BUILD_DIR's objects (there: about a minute; deeper, a
# build from scratch). It is removed when the test passes.
cmake_minimum_required(VERSION 3.18)
file(REMOVE_RECURSE "${WORK_DIR}")
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()

if(LIBRARY_ONLY)
  set(forwarded CMAKE_CXX_COMPILER CMAKE_BUILD_TYPE CMAKE_CXX_FLAGS CMAKE_EXE_LINKER_FLAGS
      CMAKE_SHARED_LINKER_FLAGS CMAKE_PREFIX_PATH Torch_DIR ZERO_TORCH_PYTHON ZERO_WITH_CUDA)
  load_cache("${BUILD_DIR}" READ_WITH_PREFIX parent_ ${forwarded} CCACHE_PROGRAM)
  if(NOT parent_CCACHE_PROGRAM)
    # Without ccache the library compiles from scratch: tens of minutes on 2 cores.
    message("install.library_only: skipped: no ccache, the build would take too long")
    return()
  endif()
  set(options)
  foreach(var IN LISTS forwarded)
    if(NOT "${parent_${var}}" STREQUAL "")
      string(REPLACE ";" "\\;" value "${parent_${var}}")
      list(APPEND options "-D${var}=${value}")
    endif()
  endforeach()
  set(tree "${BUILD_DIR}-library-only")
  file(REMOVE_RECURSE "${tree}")
  run(${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${tree}" -G Ninja ${options}
      -DZERO_BUILD_TESTS=OFF -DZERO_BUILD_EXAMPLES=OFF -DZERO_BUILD_BENCH=OFF)
  execute_process(COMMAND ${CMAKE_COMMAND} --install "${tree}" --prefix "${WORK_DIR}/unbuilt"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  string(REGEX REPLACE "[ \n]+" " " out "${out}")
  if(rc EQUAL 0 OR NOT out MATCHES "not built yet: zero, zero_activations, zero-run, zero-config, zero-ckpt.*--target zero-install-set")
    message(FATAL_ERROR "an install before the build did not refuse, naming zero-install-set (${rc}): ${out}")
  endif()
  if(EXISTS "${WORK_DIR}/unbuilt")
    message(FATAL_ERROR "an install before the build copied files into ${WORK_DIR}/unbuilt")
  endif()
  # The default target's steps are zero-install-set's (Ninja's dry runs).
  foreach(target all zero-install-set)
    execute_process(COMMAND ${CMAKE_COMMAND} --build "${tree}" --target ${target} -- -n
      RESULT_VARIABLE rc OUTPUT_VARIABLE out)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "a dry run of ${target} failed (${rc}): ${out}")
    endif()
    string(REGEX REPLACE "\\[[0-9]+/[0-9]+\\] " "" out "${out}")
    string(REPLACE "\n" ";" steps_${target} "${out}")
    list(SORT steps_${target})
  endforeach()
  if(NOT steps_all STREQUAL steps_zero-install-set)
    list(REMOVE_ITEM steps_all ${steps_zero-install-set})
    string(REPLACE ";" "\n  " steps_all "${steps_all}")
    message(FATAL_ERROR "with tests, examples and benchmarks off the default target builds more than zero-install-set:${steps_all}")
  endif()
  run(${CMAKE_COMMAND} --build "${tree}" --target zero-install-set -j 2)
  set(BUILD_DIR "${tree}")
endif()

set(prefix "${WORK_DIR}/prefix")
run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
# The tools and nothing else: examples (zero-main, zero-accelerate-gpt,
# ...) are run from the build tree, never installed.
file(GLOB installed RELATIVE "${prefix}/bin" "${prefix}/bin/*")
list(SORT installed)
if(NOT installed STREQUAL "zero-ckpt;zero-config;zero-llama;zero-run")
  message(FATAL_ERROR "bin/ holds '${installed}', not the tools 'zero-ckpt;zero-config;zero-llama;zero-run' alone")
endif()
load_cache("${BUILD_DIR}" READ_WITH_PREFIX installed_ CMAKE_INSTALL_LIBDIR)
foreach(lib libzero.so libzero_activations.so libzero_llama.so)
  if(NOT EXISTS "${prefix}/${installed_CMAKE_INSTALL_LIBDIR}/${lib}")
    message(FATAL_ERROR "${prefix}/${installed_CMAKE_INSTALL_LIBDIR}/${lib} is missing")
  endif()
endforeach()
execute_process(COMMAND "${prefix}/bin/zero-config" "${SOURCE_DIR}/configs/main.json"
  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE out)
if(NOT rc EQUAL 0 OR NOT out MATCHES "is valid")
  message(FATAL_ERROR "the installed zero-config failed (${rc}): ${out}")
endif()

run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/install/consumer" -B "${WORK_DIR}/build"
    -G Ninja -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release
    "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${CXX_FLAGS}")
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/consumer")
run("${prefix}/bin/zero-run" --nproc 2 "${WORK_DIR}/build/consumer")
# The README's user program: stage 2 on 2 ranks to step 4, then resumed
# at stage 3 on 1 rank to step 8, against 8 uninterrupted steps on 2 ranks.
set(train "${WORK_DIR}/train")
file(REMOVE_RECURSE "${train}")
file(MAKE_DIRECTORY "${train}")
run("${prefix}/bin/zero-run" --nproc 2 "${WORK_DIR}/build/consumer" train 2 4 "${train}/ckpt" "${train}/resumed.log")
run("${prefix}/bin/zero-run" --nproc 1 "${WORK_DIR}/build/consumer" train 3 8 "${train}/ckpt" "${train}/resumed.log")
run("${prefix}/bin/zero-run" --nproc 2 "${WORK_DIR}/build/consumer" train 2 8 "${train}/reference" "${train}/reference.log")
run("${WORK_DIR}/build/consumer" compare "${train}/resumed.log" "${train}/reference.log" 1e-5)

# README's Llama program (zero::llama) fine-tunes a Hugging Face fixture for
# 3 steps, against the installed zero-llama on the same data: the same
# losses, and the same model.safetensors bytes from save_16bit_model and
# zero-llama's --save-hf.
set(llama "${WORK_DIR}/llama")
set(fixtures "${SOURCE_DIR}/tests/fixtures/llama")
file(REMOVE_RECURSE "${llama}")
file(MAKE_DIRECTORY "${llama}")
file(WRITE "${llama}/ds.json" [=[{"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}, "zero_optimization": {"stage": 2}}]=])
foreach(side program tool)
  if(side STREQUAL "program")
    set(command "${WORK_DIR}/build/consumer_llama" "${fixtures}/gqa_untied" "${llama}/ds.json" "${fixtures}/tokens.bin" 3
        "${llama}/${side}")
  else()
    set(command "${prefix}/bin/zero-llama" train --hf-dir "${fixtures}/gqa_untied" --config "${llama}/ds.json"
        --tokens "${fixtures}/tokens.bin" --steps 3 --ctx 16 --save-hf "${llama}/${side}")
  endif()
  execute_process(COMMAND "${prefix}/bin/zero-run" --nproc 1 ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(REGEX MATCHALL "step [0-9]+ loss [0-9.eE+-]+" losses_${side} "${out}")
  list(LENGTH losses_${side} count)
  if(NOT rc EQUAL 0 OR NOT count EQUAL 3)
    message(FATAL_ERROR "the Llama ${side} failed (${rc}) or printed ${count} steps of 3: ${out}${err}")
  endif()
endforeach()
if(NOT losses_program STREQUAL losses_tool)
  message(FATAL_ERROR "README's Llama program's losses '${losses_program}' are not zero-llama's '${losses_tool}'")
endif()
file(SHA256 "${llama}/program/model.safetensors" program_hash)
file(SHA256 "${llama}/tool/model.safetensors" tool_hash)
if(NOT program_hash STREQUAL tool_hash OR NOT EXISTS "${llama}/program/config.json")
  message(FATAL_ERROR "README's Llama program saved other weights than zero-llama --save-hf, or no config.json")
endif()
message("install: README's Llama program: ${losses_program}, the same as zero-llama's, and the same saved bytes")
if(LIBRARY_ONLY)
  file(REMOVE_RECURSE "${tree}")
endif()
