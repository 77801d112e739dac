# Shared compile options for every pptrain target (an INTERFACE target, linked PRIVATE).
add_library(pptrain_warnings INTERFACE)
target_compile_options(pptrain_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wno-unused-parameter>)
