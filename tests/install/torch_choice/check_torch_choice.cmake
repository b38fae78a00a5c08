# Configure refuses a LibTorch older than zero's minimum, and a LibTorch
# whose TorchConfig.cmake and libtorch.so come from two distributions, each
# with one line that names what it found (cmake/TorchChoice.cmake).
# Variables: SOURCE_DIR, WORK_DIR.
set(here "${SOURCE_DIR}/tests/install/torch_choice")
function(expect_refused kind pattern)
  file(REMOVE_RECURSE "${WORK_DIR}/${kind}")
  execute_process(
    COMMAND ${CMAKE_COMMAND} -S "${here}/project" -B "${WORK_DIR}/${kind}" -DZERO_SOURCE_DIR=${SOURCE_DIR}
            -DCMAKE_PREFIX_PATH=${here}/fake_${kind}/share/cmake
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(FATAL_ERROR "configure accepted the ${kind} LibTorch:\n${out}${err}")
  endif()
  string(REGEX REPLACE "[ \n]+" " " flat "${err}")
  if(NOT flat MATCHES "${pattern}")
    message(FATAL_ERROR "configure refused the ${kind} LibTorch without the expected line '${pattern}':\n${err}")
  endif()
  message(STATUS "${kind}: refused as expected")
endfunction()
expect_refused(old "zero: LibTorch 1.12.1 found at .*fake_old; zero needs 1.13 or newer")
expect_refused(mixed "zero: LibTorch 2.15.0's TorchConfig.cmake is under .*fake_mixed but it found /elsewhere/lib/libtorch.so, another LibTorch")
