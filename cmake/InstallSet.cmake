# What `cmake --install` copies, and the target that builds exactly that.
#
# ZERO_INSTALLED_TARGETS names every target an install(TARGETS) rule copies:
# the library (libzero, with libzero_activations beside it), the tools
# zero-run, zero-config and zero-ckpt, and the Llama family (libzero_llama,
# zero::llama) with its tool zero-llama. Examples, tests and benchmarks are
# never installed. The rules themselves sit beside their targets
# (tools/*/CMakeLists.txt, llama/CMakeLists.txt, the install section of the top-level
# CMakeLists.txt); the test install.library_only builds zero-install-set
# alone and installs it, so a rule whose target is missing here fails it.
set(ZERO_INSTALLED_TARGETS zero zero_activations zero-run zero-config zero-ckpt zero_llama zero-llama)

# `cmake --build BUILD --target zero-install-set`: what the install copies
# and nothing more.
add_custom_target(zero-install-set)
add_dependencies(zero-install-set ${ZERO_INSTALLED_TARGETS})

# A tree built only in part (tools/build.sh --target ...) would fail half-way
# through the install with file(INSTALL)'s "cannot find"; this rule runs
# before every other (the top-level CMakeLists.txt includes this file before
# its add_subdirectory calls), names what is missing and how to build it.
set(_zero_check "set(_zero_missing)\n")
foreach(_zero_target IN LISTS ZERO_INSTALLED_TARGETS)
  string(APPEND _zero_check "if(NOT EXISTS \"$<TARGET_FILE:${_zero_target}>\")\n"
                            "  list(APPEND _zero_missing ${_zero_target})\n"
                            "endif()\n")
endforeach()
string(APPEND _zero_check
  "if(_zero_missing)\n"
  "  string(REPLACE \";\" \", \" _zero_missing \"\${_zero_missing}\")\n"
  "  message(FATAL_ERROR \"zero: not built yet: \${_zero_missing}. Build what the install copies first: \"\n"
  "                      \"cmake --build ${PROJECT_BINARY_DIR} --target zero-install-set\")\n"
  "endif()\n")
install(CODE "${_zero_check}")
unset(_zero_check)
